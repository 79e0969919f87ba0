"""Tasks: each builds its examples, runs them through the engine and returns rows and a summary.

Tasks know nothing of MLflow or Hydra; src/tracking/record.py logs what they return.
"""

from src.tasks import benchmark, benchmark_code, decode, perplexity, quantize
from src.tasks.common import TaskInputs, TaskResult

# Keyed by task.kind: benchmark and benchmark_long share one implementation with other lengths.
TASKS = {"decode": decode.run, "benchmark": benchmark.run, "benchmark_code": benchmark_code.run,
         "perplexity": perplexity.run, "quantize": quantize.run}

__all__ = ["TASKS", "TaskInputs", "TaskResult"]
