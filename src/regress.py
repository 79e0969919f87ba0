"""python -m src.regress: Compare two sweeps job by job and judge each change. Its settings and usage: `python -m src.regress --help`;
the command's own module is src.tracking.readback.regression."""

from src.common import startup  # first: the collector paused for the imports below

# isort: split
import sys

from src.tracking.readback.regression.cli import main

startup.imported()

if __name__ == "__main__":
    sys.exit(startup.run(main, sys.argv[1:]))
