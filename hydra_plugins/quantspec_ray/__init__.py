"""quantspec's Hydra launcher plugin: `hydra/launcher=ray` (see ray_launcher.py)."""
