"""The axes a sweep composes (conf/<axis>/): a job's identity, in the order its name and tags list them. Here, at
the bottom of the house, so what reads records back (src.tracking.readback: the report, regress) names them
without importing the configs' classes, and with them torch."""

AXES = ("model", "hardware", "precision", "draft", "task", "engine")
# the command line's groups: the axes, and the two that are not part of a job's identity
GROUPS = (*AXES, "dataset", "tracking")
