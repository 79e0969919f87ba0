"""quantspec's Hydra sweeper plugin: `hydra/sweeper=search` (see search_sweeper.py)."""
