"""python -m src.report: Write a sweep's report and attach it to the sweep in MLflow. Its settings and usage: `python -m src.report --help`;
the command's own module is src.tracking.readback.report.cli."""

import sys

from src.tracking.readback.report.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
