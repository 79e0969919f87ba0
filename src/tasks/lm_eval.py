"""lm-evaluation-harness's tasks on the job's model (src.quality.harness): accuracy with its standard error
per task, each item's outcome kept (lm_eval_samples.jsonl) for paired comparisons between jobs."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math

from src.engine import Sampling
from src.engine.generation import Request
from src.quality import harness
from src.tasks.timed import TaskInputs, TaskResult

log = logging.getLogger("quantspec")
PER_ITEM = ("acc", "acc_norm", "exact_match")  # per-item outcomes kept for McNemar


@functools.cache
def _manager():
    """lm-eval's index of its tasks and the local ones: once per process, as it reads some 15,000 task files
    (13-15 s here) and a sweep's lm_eval jobs share a process."""
    from lm_eval.tasks import TaskManager  # optional: the eval extra

    return TaskManager(include_path=str(harness.LOCAL_TASKS), verbosity="ERROR")


def _load(names: list[str]):
    """The tasks, or one line saying why one cannot be had here (unknown, or its dataset unreachable)."""
    from lm_eval.tasks import get_task_dict  # optional: the eval extra

    manager = _manager()
    unknown = [n for n in names if n not in manager.all_tasks]
    if unknown:
        local = sorted(p.stem for p in harness.LOCAL_TASKS.glob("*.yaml"))
        raise ValueError(
            f"lm-eval {harness.VERSION} has no task {', '.join(unknown)}; local tasks: {', '.join(local)} "
            f"(hub tasks such as arc_easy, hellaswag, piqa, winogrande, mmlu need the hub)"
        )
    for name in names:
        try:
            get_task_dict([name], manager)
        except Exception as err:  # noqa: BLE001 - datasets' many network errors: one line, what to do
            first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
            raise ValueError(
                f"lm-eval task {name}: its dataset could not be loaded ({type(err).__name__}: {first}); "
                f"a hub task needs the Hugging Face hub reachable from this machine, or use a local "
                f"task (task.tasks=[quantspec_facts])"
            ) from None
    return manager


def run(inputs: TaskInputs) -> TaskResult:
    import lm_eval  # optional: the eval extra

    task = inputs.task
    pad = inputs.tokenizer.pad_token_id

    def generate(ids, n, stop):  # greedy, through the job's engine (its kernels, its runtime)
        return inputs.generate(inputs.model, Request(ids, n, False, Sampling(), pad, stop=stop)).new_token_ids

    lm = harness.make_lm(inputs.score, inputs.tokenizer, inputs.max_context, generate, task.max_new_tokens)
    # the local tasks name their data files relative to their YAML
    with contextlib.chdir(harness.LOCAL_TASKS):
        manager = _load(list(task.tasks))
        out = lm_eval.simple_evaluate(
            model=lm,
            tasks=list(task.tasks),
            num_fewshot=task.num_fewshot,
            limit=task.limit,
            task_manager=manager,
            log_samples=True,
            bootstrap_iters=1000,
            random_seed=0,
            numpy_random_seed=0,
            torch_random_seed=0,
            fewshot_random_seed=0,
        )
    summary, samples, accs = {}, [], []
    for name, figures in out["results"].items():
        for key, value in figures.items():
            metric, _, filt = key.partition(",")  # "acc,none": the metric, and the filter its answers went through
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                summary[f"lm_eval/{name}/{metric}" + ("" if filt in ("", "none") else f"_{filt}")] = float(value)
        if "acc,none" in figures:
            accs.append((figures["acc,none"], figures.get("acc_stderr,none", math.nan)))
    for name, docs in out.get("samples", {}).items():
        for doc in docs:
            samples.append(
                {
                    "task": name,
                    "doc_id": doc["doc_id"],
                    "target": str(doc.get("target")),
                    **{m: float(doc[m]) for m in PER_ITEM if m in doc},
                }
            )
    if accs:  # one figure for the front and the report: the tasks' mean accuracy
        summary["accuracy"] = sum(a for a, _ in accs) / len(accs)
        summary["accuracy_se"] = math.sqrt(sum(s * s for _, s in accs if isinstance(s, float))) / len(accs)
    summary["lm_eval_items"] = float(len(samples))
    text = "\n".join(json.dumps(s) for s in samples) + "\n"
    results = json.dumps(
        {"results": out["results"], "versions": out.get("versions", {}), "n-shot": out.get("n-shot", {})},
        indent=2,
        default=str,
    )
    return TaskResult(
        [],
        summary,
        artifacts={"lm_eval_samples.jsonl": text, "lm_eval_results.json": results},
        tags={"lm_eval_version": harness.VERSION, "lm_eval_tasks": ",".join(task.tasks)},
    )
