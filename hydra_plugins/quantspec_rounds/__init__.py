"""quantspec's Hydra sweeper plugin: `hydra/sweeper=rounds` (see rounds_sweeper.py)."""
