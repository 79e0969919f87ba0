"""Reading a sweep back from its store: its jobs (sweeps), their rounds and speedups (compare), quality beside
speed (quality), one sweep against another (regress) and the report (report/). Nothing here writes a run but
the report's own attachment to its sweep's parent."""
