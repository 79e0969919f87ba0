"""Interleaved rounds: the schedule, the per-round ratios and their range, busy rounds re-measured and
left out, and a real sweep in rounds end to end (report, parent run, the view's runs)."""

import math
from types import SimpleNamespace

import pytest
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.errors import ConfigCompositionException
from mlflow.tracking import MlflowClient

from src.common import signals
from src.common.environment import PROJECT_ROOT
from src.tracking.readback.compare import JobRounds, job_rounds, ratio_spread, spread
from src.tracking.readback.sweeps import sweep_jobs
from src.tracking.store.names import config_key
from src.tracking.sweep.record import SweepAbort
from src.tracking.sweep.rounds import legal, schedule
from tests.support.cli import run_cli
from tests.support.processes import spinning_neighbours
from tests.support.records import job_record

TINY = ["model=tiny-llama", "task=benchmark", "task.prompt_lengths=[4,8]", "task.max_new_tokens=4", "task.warmup=0"]


def test_each_round_rotates_the_jobs_so_each_takes_every_position_once():
    jobs = [["precision=fp32"], ["precision=bf16"], ["precision=w8a8"]]
    rounds = schedule(jobs, 3)
    assert rounds[0] == jobs  # round 1 is the sweep without rounds: the same jobs, dirs and keys
    assert [j[0] for j in rounds[1]] == ["precision=bf16", "precision=w8a8", "precision=fp32"]
    assert all(job[-1] == "round=2" for job in rounds[1]) and all(job[-1] == "round=3" for job in rounds[2])
    for position in range(3):
        assert sorted(r[position][0] for r in rounds) == sorted(j[0] for j in jobs)
    assert schedule(jobs, 1, first=5)[0][0] == ["precision=bf16", "round=5"]  # an extra round goes on rotating
    assert config_key("precision=w8a8,round=2,task.limit=2") == config_key("precision=w8a8,task.limit=2")


def test_busy_rounds_are_left_out_where_a_quiet_one_remains_and_marked_where_none_does():
    s = spread({1: (10.0, False), 2: (30.0, True), 3: (12.0, False), 4: (math.nan, False)})
    assert (s.median, s.low, s.high, s.used, s.excluded, s.all_busy) == (11.0, 10.0, 12.0, 2, 1, False)
    assert "1 busy round left out" in s.text("ms")
    s = spread({1: (10.0, True), 2: (14.0, True)})
    assert (s.median, s.used, s.all_busy) == (12.0, 2, True) and "every round busy" in s.text()
    assert math.isnan(spread({}).median)


_run = job_record


def test_a_speedup_is_the_median_of_ratios_taken_round_by_round_with_its_range():
    base = JobRounds(
        "fp32",
        [
            _run("fp32", 1, 40.0, precision="fp32"),
            _run("fp32", 2, 80.0, precision="fp32"),
            _run("fp32", 3, 44.0, precision="fp32"),
        ],
    )
    job = JobRounds("w8a8", [_run("w8a8", 1, 20.0), _run("w8a8", 2, 20.0, busy=True), _run("w8a8", 3, 20.0)])
    # round 2's 4x is taken while the job was busy: left out, though it would have been the maximum
    s = ratio_spread(job, base, "time_per_token_ms_median")
    assert (s.median, s.low, s.high, s.used, s.excluded) == (2.1, 2.0, 2.2, 2, 1)
    # a round the baseline did not finish pairs with nothing
    base.runs[2] = _run("fp32", 3, 44.0, outcome="failed", precision="fp32")
    assert ratio_spread(job, base, "time_per_token_ms_median").used == 1
    grouped = job_rounds([*base.runs, *job.runs])
    assert [c.key for c in grouped] == ["fp32", "w8a8"] and grouped[0].outcome == "2 of 3 rounds finished"


@pytest.mark.alone  # its neighbour is the only load it may count
def test_a_sweep_in_rounds_gives_ratios_with_their_range_and_remeasures_busy_rounds(tmp_path, monkeypatch):
    composed = []  # every job's config Hydra composes: once before the sweep runs, then once a later round
    real = ConfigLoaderImpl.load_sweep_config
    monkeypatch.setattr(
        ConfigLoaderImpl, "load_sweep_config", lambda self, m, o: composed.append(list(o)) or real(self, m, o)
    )
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # timed for over a second (the least over which others' CPU use is told): each of two prompts for 0.6 s,
    # sized by time (a count of repeats tuned on one host took 70-80 s an example on another, under load)
    args = [
        "-m",
        "model=tiny-llama",
        "task=benchmark",
        "task.limit=2",
        "task.min_time_s=0.6",
        "precision=fp32,w8a8",
        "rounds=2",
        "busy_reruns=1",
        f"tracking.uri={store}",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
    ]
    # a real neighbour: a process spinning on one of the host's cores for the whole sweep, so every round
    # is timed on a busy host and earns a re-measure, up to busy_reruns=1
    with spinning_neighbours(1):
        out = run_cli(args)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "2 of 2 rounds ran on a busy host (host_busy); measuring round 3 (1 of at most 1 more)" in out.stdout
    assert "3 of 3 rounds ran on a busy host (host_busy) and busy_reruns=1 are spent" in out.stdout
    assert "sweep done: 6 finished" in out.stdout  # 2 jobs x (2 rounds + 1 re-measured)
    # round 1's jobs composed once (the launcher takes what the sweeper composed to check them), rounds 2 and 3's
    # once each
    assert (
        len(composed) == 6
        and sorted(o[-1] for o in composed if o[-1].startswith("round=")) == ["round=2"] * 2 + ["round=3"] * 2
    ), composed
    parent_id, jobs = sweep_jobs(store, sweep_id=str((tmp_path / "sweep").resolve()))
    assert sorted((j.tags["precision"], j.tags["round"]) for j in jobs) == [
        (p, r) for p in ("fp32", "w8a8") for r in ("1", "2", "3")
    ]
    client = MlflowClient(store)
    parent = client.get_run(parent_id).data
    assert (
        parent.metrics["best/decode_speedup_low"]
        <= parent.metrics["best/decode_speedup"]
        <= parent.metrics["best/decode_speedup_high"]
    )
    assert parent.tags["best_speedup_rounds"] == "3 [every round busy]"
    md = next((PROJECT_ROOT / "reports").glob(f"*-{parent.tags['quantspec.sweep_key'][:8]}")) / "report.md"
    text = md.read_text()
    assert "Measured in 3 interleaved rounds" in text and "every round busy" in text
    # per round, the ratio of the same round's medians
    by = {(j.tags["precision"], j.tags["round"]): j.metrics["time_per_token_ms_median"] for j in jobs}
    ratios = sorted(by[("fp32", r)] / by[("w8a8", r)] for r in ("1", "2", "3"))
    shown = next(j for j in jobs if j.tags["precision"] == "w8a8" and j.tags["round"] == "1")
    held = client.get_run(shown.run_id).data
    assert held.tags["quantspec.shown"] == "true" and held.tags["busy_rounds"] == "3 of 3"
    assert math.isclose(held.metrics["rounds/decode_speedup"], float(f"{ratios[1]:.3g}"))
    assert (held.metrics["rounds/decode_speedup_low"], held.metrics["rounds/decode_speedup_high"]) == (
        float(f"{ratios[0]:.3g}"),
        float(f"{ratios[2]:.3g}"),
    )
    history = client.get_metric_history(shown.run_id, "round/decode_speedup")
    assert sorted(p.step for p in history) == [1, 2, 3]
    assert sorted(p.value for p in history) == sorted(ratios)

    # rerun into the same directory: every round kept, nothing measured again, no metric point added
    again = run_cli(args)
    assert again.returncode == 0 and again.stdout.count("already finished in this sweep") == 6, again.stdout[-2000:]
    assert len(client.get_metric_history(shown.run_id, "round/decode_speedup")) == 3
    assert len(client.get_metric_history(parent_id, "best/decode_speedup")) == 1


def test_rounds_take_one_whole_value(tmp_path):
    for n, (bad, said) in enumerate(
        (
            ("rounds=1,3", "rounds takes one value, not a sweep"),
            ("rounds=0", "rounds must be a whole"),
            ("rounds=two", "rounds='two' must be an integer"),
        )
    ):
        out = run_cli(
            [
                "-m",
                *TINY,
                "precision=fp32",
                bad,
                f"tracking.uri=sqlite:///{tmp_path / 'm.db'}",
                f"hydra.sweep.dir={tmp_path / str(n)}",
            ]
        )
        assert out.returncode == 2 and said in out.stderr and "Traceback" not in out.stderr, out.stderr[-1500:]
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr


class _Uncomposable:
    """A sweeper whose loader fails as Hydra's does when a stop lands inside its composition: a composition
    error with no message."""

    def __init__(self):
        self.hydra_context, self.config = SimpleNamespace(config_loader=SimpleNamespace(compose_ahead=_fail)), None


def _fail(config, overrides):
    raise ConfigCompositionException()


def test_a_job_that_cannot_be_composed_is_one_line_and_a_stop_inside_the_composition_is_the_stop():
    """Fresh-clone CI: a SIGTERM that landed inside legal()'s composition came back as a composition error with no
    message, and the sweep ended rc 1 with an IndexError's traceback instead of rc 143 in one line."""
    saved = signals._pending
    try:
        signals._pending = None
        with pytest.raises(SweepAbort, match="a job of the sweep cannot be composed: no message"):
            legal(_Uncomposable(), [["precision=fp32"]])
        signals._pending = 15  # the stop's handler sets this before it raises
        with pytest.raises(signals.Stopped, match="SIGTERM"):
            legal(_Uncomposable(), [["precision=fp32"]])
    finally:
        signals._pending = saved
