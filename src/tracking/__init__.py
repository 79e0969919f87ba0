"""A job's lifecycle and its records in MLflow, in four rooms, each importing only the ones below it:

- sweep/: the sweepers and a job run end to end with its outcome (record, rounds, search, signals);
- readback/: a sweep's jobs read back: their rounds' spread and speedups (compare), quality beside speed
  (quality), a sweep against another (regress), and the report (report/);
- store/: MLflow I/O without Hydra: the names runs carry (names, catalog), one experiment in one store
  (experiment), one job's run (jobrun), its journal and replays (journal, replay, sync), runs dead processes
  left RUNNING (owner, reaping), turns taken per store (locks);
- view/: the sweep's view in MLflow's UI (ui) and the page that serves it (view_app).

sweep/ and readback/ know nothing of each other; view/ knows no other room (pyproject's import-linter contracts).
"""
