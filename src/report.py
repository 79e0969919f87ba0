"""python -m src.report: Write a sweep's report and attach it to the sweep in MLflow. Its settings and usage: `python -m src.report --help`;
the command's own module is src.tracking.readback.reporting.cli."""

from src.common import startup  # first: the collector paused for the imports below

# isort: split
import sys

from src.tracking.readback.reporting.cli import main

startup.imported()

if __name__ == "__main__":
    sys.exit(startup.run(main, sys.argv[1:]))
