"""python -m src.sync: Replay journaled results into the tracking stores they were written for. Its settings and usage: `python -m src.sync --help`;
the command's own module is src.tracking.store.sync."""

from src.common import startup  # first: the collector paused for the imports below

# isort: split
import sys

from src.tracking.store.sync import main

startup.imported()

if __name__ == "__main__":
    sys.exit(startup.run(main, sys.argv[1:]))
