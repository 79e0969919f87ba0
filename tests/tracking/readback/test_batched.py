"""The report's offline batching table (src.tracking.readback.batched): each task=batch configuration's batch sizes,
the median of their rounds, llama-batched-bench's beside quantspec's, each TG rate over B=1's."""

from src.tracking.readback import batched, compare
from src.tracking.readback.compare import job_rounds
from src.tracking.readback.sweeps import JobRecord
from src.tracking.store.names import CONFIG_KEY


def run(runner, round_, tg_by_b, outcome="finished", task="batch"):
    tags = {
        CONFIG_KEY: f"{runner}-{task}", "round": str(round_), "outcome": outcome, "runner": runner, "model": "m",
        "hardware": "cpu", "precision": "w4a16", "draft": "none", "task": task, "engine": "native",
    }  # fmt: skip
    metrics = {f"batch_tg_tokens_per_s_b{b}": tg for b, tg in tg_by_b.items()}
    metrics.update({f"batch_pp_tokens_per_s_b{b}": 10 * tg for b, tg in tg_by_b.items()})
    return JobRecord(f"{runner}{round_}", f"m·cpu·w4a16·none·batch·runner={runner} round {round_}", tags, metrics, {})


def test_each_batch_size_is_its_rounds_median_beside_the_peers():
    jobs = [
        run("quantspec", 1, {1: 100.0, 8: 300.0}), run("quantspec", 2, {1: 110.0, 8: 340.0}),
        run("quantspec", 3, {1: 1.0, 8: 1.0}, outcome="failed"), run("llama-batched-bench", 1, {1: 50.0, 8: 150.0}),
    ]  # fmt: skip
    found = batched.sizes(job_rounds(jobs))
    assert [(("llama" in s.config), s.batch, s.tg, s.rounds) for s in found] == [
        (True, 1, 50.0, 1), (True, 8, 150.0, 1), (False, 1, 105.0, 2), (False, 8, 320.0, 2),
    ]  # fmt: skip
    text = batched.table(found)
    assert "m·cpu (llama-batched-bench, the model's GGUF)" in text and "m·cpu·w4a16·native (quantspec)" in text
    assert "3.05x" in text and "3.00x" in text  # 320 / 105, 150 / 50
    assert batched.sizes(job_rounds([run("quantspec", 1, {1: 9.0}, task="decode")])) == []


def test_settings_a_sweep_varied_tell_two_rows_of_the_same_choices_apart():
    a = run("quantspec", 1, {1: 100.0})
    b = run("quantspec", 1, {1: 200.0})
    b.tags[CONFIG_KEY] += "-int8"
    b.name = "m·cpu·w4a16·none·batch·runner=quantspec·batch_activations=int8 round 1"
    found = batched.sizes(job_rounds([a, b]))
    assert sorted(s.config for s in found) == [
        "m·cpu·w4a16·native (quantspec)", "m·cpu·w4a16·native·batch_activations=int8 (quantspec)",
    ]  # fmt: skip
    assert compare.swept("m·cpu·serve·concurrency=8·server=x round 2", ("concurrency", "server")) == []
