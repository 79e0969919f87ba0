"""MLflow I/O: where every record of a job goes, and how it gets there even when the store is away.

Nothing here knows Hydra: a sweep's settings arrive as plain values (src.tracking.sweep converts them).
"""
