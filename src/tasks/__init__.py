"""Tasks: each builds its examples, runs them through the engine and returns rows and a summary.

Which tasks exist, their fields and their checks: src.tasks.kinds (TASKS). Tasks know nothing of MLflow
or Hydra; src/tracking/sweep/record.py logs what they return.
"""
