"""The sweep report against the runs' own metrics, and a real MLflow tracking server on loopback."""

import html
import json
import math
import urllib.request

import jsonschema
import pytest
from mlflow.tracking import MlflowClient

from src.tracking.readback import reporting as report
from src.tracking.readback.reporting import plots
from src.tracking.readback.sweeps import sweep_jobs
from tests.support.cli import fresh_cache, run_cli
from tests.support.processes import free_port, mlflow_server, spinning_neighbours
from tests.support.records import doc_schema, job_record

TINY = ["model=tiny-llama", "task=benchmark", "task.prompt_lengths=[4,8]", "task.max_new_tokens=4", "task.warmup=0"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sweep")
    store = f"sqlite:///{tmp / 'mlflow.db'}"
    out = run_cli(
        ["-m", *TINY, "precision=fp32,bf16,w8a8", f"tracking.uri={store}", f"hydra.sweep.dir={tmp / 'sweep'}"]
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return store, tmp


@pytest.mark.parametrize("module, args", [("src.report", []), ("src.regress", ["against=x"])])
def test_an_output_folder_that_cannot_be_written_is_one_line_before_the_store_is_read(sweep, module, args):
    """out=/proc/x had ended both commands in a FileNotFoundError traceback, exit 1 (regress's "slower")."""
    store, _ = sweep
    out = run_cli([*args, f"tracking.uri={store}", "out=/proc/x"], module=module)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert out.stderr.strip() == "quantspec: out=/proc/x cannot be written (No such file or directory: /proc/x); " + (
        "name a folder you can write"
    )


def test_a_baseline_no_job_has_is_refused_in_one_line(sweep, tmp_path):
    """baseline.precision=zzz had written a report saying "(no job has its baseline in this sweep)", exit 0."""
    store, _ = sweep
    out = run_cli([f"tracking.uri={store}", "baseline.precision=zzz", f"out={tmp_path}"], module="src.report")
    assert out.returncode == 2 and not list(tmp_path.iterdir()), out.stderr[-2000:]
    assert out.stderr.strip() == (
        "quantspec: baseline.precision=zzz is no job's precision in this sweep (its jobs': bf16, fp32, w8a8); "
        "name one of those"
    )


def test_the_report_as_json_is_the_documented_document_and_stdout_holds_only_it(sweep, tmp_path):
    store, _ = sweep
    out = run_cli([f"tracking.uri={store}", "format=json", f"out={tmp_path}", "attach=false"], module="src.report")
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout, parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))  # strict: no NaN
    jsonschema.validate(doc, doc_schema("sweep"))  # docs/reference/report-json.md's
    assert out.stderr.startswith("written to ")  # beside the document, not in it
    assert sorted(j["choices"]["precision"] for j in doc["jobs"]) == ["bf16", "fp32", "w8a8"]
    rep = report.build(store, "quantspec", None, {"precision": "fp32", "draft": "none"}, tmp_path / "again")
    by_name = {c.name: c for c in rep.configs}
    for job in doc["jobs"]:  # the runs' own figures: one round, so the median is the run's value
        run = by_name[job["name"]].shown
        for name in ("time_per_token_ms_median", "itl_ms_p99", "ttft_ms_p50", "peak_rss_gb"):
            assert (
                job["figures"][name]["median"] == pytest.approx(run.metrics[name])
                and job["figures"][name]["rounds"] == 1
            )
    (base,) = [s for s in doc["speedups"] if s["is_baseline"]]
    assert base["job"].split("·")[2] == "fp32" and base["time_per_token"]["median"] == pytest.approx(1)
    assert len(list(tmp_path.glob("*/report.json"))) == 1  # written where report.md is, again's aside


def test_report_numbers_are_the_runs_own(sweep):
    store, tmp = sweep
    rep = report.build(store, "quantspec", None, {"precision": "fp32", "draft": "none"}, tmp / "reports")
    client = MlflowClient(store)
    by_name = {j.name: j for j in rep.jobs}
    assert len(rep.jobs) == 3 and len(rep.summary) == 3
    for row in rep.summary:
        job = by_name[row[0]]
        # one round: the run's own medians, to the 3 significant digits a report shows
        assert row[4] == float(f"{job.metrics['time_per_token_ms_median']:.3g}")
        assert row[5] == float(f"{job.metrics['prefill_ms_median']:.3g}")
        assert row[3] == f"quantspec/{job.tags['kernels_isa']}" and job.tags["kernels"] == "quantspec"
        # what ran, beside what was asked: the cpu profile on the host's CPU, as params and in the row
        assert row[2] == f"host CPU ({job.params['executed.cpu']})" == job.tags["ran_on"]
        assert job.params["executed.device"] == "cpu" and int(job.params["executed.threads"]) >= 1
        assert job.params["executed.runtime"].startswith("quantspec native engine, torch ")
    # each seed table holds the per-example metric histories
    for name, job in by_name.items():
        history = {m.step: m.value for m in client.get_metric_history(job.run_id, "by_example/time_per_token_ms")}
        rows = report.job_rows(client, job)
        assert [r.time_per_token_ms for r in rows] == [history[s] for s in sorted(history)]
        assert [r.prompt_tokens for r in rows] == [4, 8]
        assert name in rep.tables


def test_speedups_are_the_hand_computed_ratios(sweep):
    store, tmp = sweep
    rep = report.build(store, "quantspec", None, {"precision": "fp32", "draft": "none"}, tmp / "reports")
    jobs = {j.choice("precision"): j.metrics for j in rep.jobs}
    rows = {u.job.choice("precision"): u for u in rep.speedups}
    for precision in ("fp32", "bf16", "w8a8"):
        expect = jobs["fp32"]["time_per_token_ms_median"] / jobs[precision]["time_per_token_ms_median"]
        # one round: the median, min and max of one ratio
        assert (rows[precision].time.median, rows[precision].time.low, rows[precision].time.used) == (
            pytest.approx(expect),
            pytest.approx(expect),
            1,
        )
        assert rows[precision].prefill.median == pytest.approx(
            jobs["fp32"]["prefill_ms_median"] / jobs[precision]["prefill_ms_median"]
        )
    assert rows["fp32"].time.median == 1.0 and rows["fp32"].is_baseline
    # another baseline, chosen in config
    other = report.build(store, "quantspec", None, {"precision": "bf16"}, tmp / "reports")
    assert {u.base.choice("precision") for u in other.speedups} == {"bf16"}


def test_report_writes_plots_and_attaches_them_to_the_parent(sweep):
    store, tmp = sweep
    assert report.main([f"tracking.uri={store}", f"out={tmp / 'out'}"]) == 0
    written = {p.name for p in (tmp / "out").rglob("*") if p.is_file()}
    assert {
        "report.md",
        "summary.csv",
        "time_per_token_ms_vs_prompt.png",
        "prefill_ms_vs_prompt.png",
        "speedup.png",
    } <= written
    client = MlflowClient(store)
    parent_id, _ = sweep_jobs(store)
    attached = {a.path for a in client.list_artifacts(parent_id, "report")}
    assert "report/report.md" in attached and "report/speedup.png" in attached


def test_a_job_whose_kernels_fell_back_is_said_marked_and_kept_out_of_the_headlines(tmp_path):
    # No compiler on PATH and an empty cache: quantspec's kernels cannot be built, ATen's run.
    store, empty = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "bin"
    empty.mkdir()
    out = run_cli(
        ["-m", *TINY, "precision=fp32,w8a8", f"tracking.uri={store}", f"hydra.sweep.dir={tmp_path / 's'}"],
        env={"PATH": str(empty), "CXX": "", "QUANTSPEC_CACHE": str(fresh_cache(tmp_path / "cache", kernels=False))},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    said = [line for line in (out.stdout + out.stderr).splitlines() if "quantspec kernels unavailable" in line]
    assert len(said) == 2 and all("times are ATen's, not the precision's" in line for line in said), said
    rep = report.publish(store, "quantspec", None, {"precision": "fp32", "draft": "none"}, tmp_path / "reports")
    assert {j.tags["kernels"] for j in rep.jobs} == {"fallback"}
    assert {j.params["executed.kernels"] for j in rep.jobs} == {"aten (fallback)"}
    assert {row[3] for row in rep.summary} == {"ATen (FALLBACK)"}
    assert "Kernels fell back" in rep.overview and rep.overview.count("(FALLBACK)") >= 2
    parent = MlflowClient(store).get_run(rep.parent_run_id)
    assert "Kernels fell back" in parent.data.tags["mlflow.note.content"]
    assert (
        "best/decode_speedup" not in parent.data.metrics and "best/time_per_token_ms_median" not in parent.data.metrics
    )


def test_report_of_an_empty_store_is_one_line(tmp_path, capsys):
    assert report.main([f"tracking.uri=sqlite:///{tmp_path / 'none.db'}", "attach=false"]) == 2
    assert not (tmp_path / "none.db").exists()  # nothing created by looking
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("quantspec:")]
    assert len(lines) == 1 and "run a sweep first" in lines[0]


def _rest(url: str, payload: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def test_sweep_against_a_real_tracking_server(tmp_path):
    port = free_port()
    server = mlflow_server(tmp_path, port)
    base = f"http://127.0.0.1:{port}"
    try:
        out = run_cli(
            [
                "-m",
                *TINY,
                "precision=fp32,bf16",
                "tracking=server",
                f"tracking.uri={base}",
                f"hydra.sweep.dir={tmp_path / 'sweep'}",
            ]
        )
        assert out.returncode == 0, out.stderr[-2000:]
        exp = json.loads(
            urllib.request.urlopen(
                f"{base}/api/2.0/mlflow/experiments/get-by-name?experiment_name=quantspec", timeout=10
            ).read()
        )
        runs = _rest(
            f"{base}/api/2.0/mlflow/runs/search",
            {"experiment_ids": [exp["experiment"]["experiment_id"]], "max_results": 100},
        )["runs"]
        tags = [{t["key"]: t["value"] for t in r["data"].get("tags", [])} for r in runs]
        jobs = [t for t in tags if t.get("quantspec.role") == "job"]
        parents = [t for t in tags if t.get("quantspec.role") == "sweep"]
        assert len(parents) == 1 and len(jobs) == 2
        assert sorted(t["precision"] for t in jobs) == ["bf16", "fp32"]
        assert all(t["outcome"] == "finished" for t in jobs)
        metrics = [{m["key"]: m["value"] for m in r["data"].get("metrics", [])} for r in runs]
        assert sum(1 for m in metrics if m.get("time_per_token_ms_median", math.nan) > 0) == 2
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_a_rerun_of_the_report_adds_no_metric_points(sweep):
    store, tmp = sweep
    client = MlflowClient(store)
    for _ in range(2):
        rep = report.publish(store, "quantspec", None, {"precision": "fp32", "draft": "none"}, tmp / "again")
    parent = rep.parent_run_id
    assert len(client.get_metric_history(parent, "best/decode_speedup")) == 1
    assert len(client.get_metric_history(parent, "best/time_per_token_ms_median")) == 1
    assert all(len(client.get_metric_history(j.run_id, "rounds/time_per_token_ms_median")) == 1 for j in rep.jobs)
    w8a8 = next(j for j in rep.jobs if j.choice("precision") == "w8a8")
    assert len(client.get_metric_history(w8a8.run_id, "rounds/decode_speedup")) == 1


def test_report_help_touches_nothing_and_a_misspelt_setting_is_one_line(tmp_path):
    store = tmp_path / "absent.db"
    helped = run_cli(["--help", f"tracking.uri=sqlite:///{store}"], module="src.report")
    assert (
        helped.returncode == 0
        and "python -m src.report" in helped.stdout
        and "baseline.precision=fp32" in helped.stdout
    )
    assert not store.exists() and not (tmp_path / "reports").exists()
    for arg, words in (
        ("baselin.precision=bf16", "'baselin.precision=bf16' is not a setting of python -m src.report"),
        ("baseline.precison=bf16", "baseline.precison is not a setting; baseline.<model|hardware|precision"),
        ("sweep", "'sweep' is not a setting of python -m src.report"),
    ):
        out = run_cli([arg, f"tracking.uri=sqlite:///{store}"], module="src.report")
        lines = [line for line in out.stderr.splitlines() if line.startswith("quantspec:")]
        assert out.returncode == 2 and len(lines) == 1 and words in lines[0], out.stderr
        assert "Traceback" not in out.stderr and not store.exists()


def test_a_decode_sweep_gets_its_plots_and_no_empty_columns_and_a_hostile_cpu_name_stays_text(tmp_path):
    """The sweep's host names itself with markup (QUANTSPEC_CPU_NAME: a VM's model string is anyone's): report.md
    and each job's MLflow description (which the UI renders as markdown), rendered, hold no tag, no link and no
    right-to-left override (the fifth round of faults found them live)."""
    from tests.common.test_mdtext import assert_inert, render

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    hostile = "Evil | CPU <img src=x onerror=alert(1)> [l](javascript:alert(2)) ` \u202eedoc"
    out = run_cli(
        [
            "-m",
            "model=tiny-llama",
            "task.limit=3",
            "task.max_new_tokens=4",
            "task.warmup=0",
            "precision=fp32,bf16",
            f"tracking.uri={store}",
            f"hydra.sweep.dir={tmp_path / 's'}",
            "report_at_end=false",
        ],
        env={"QUANTSPEC_CPU_NAME": hostile},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rep = report.build(store, "quantspec", None, {"precision": "fp32", "draft": "none"}, tmp_path / "reports")
    assert {"time_per_token_ms_by_job.png", "prefill_ms_by_job.png", "speedup.png"} <= set(rep.files)
    page = render(rep.files["report.md"].read_text())
    assert_inert(page)
    assert "Evil | CPU <img src=x onerror=alert(1)> [l](javascript:alert(2)) ` edoc" in html.unescape(page)
    published = run_cli([f"tracking.uri={store}", f"out={tmp_path / 'published'}"], module="src.report")
    assert published.returncode == 0, published.stderr[-2000:]  # the descriptions written on the runs
    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("quantspec").experiment_id])
    notes = [r.data.tags.get("mlflow.note.content", "") for r in runs]
    assert any("Evil" in n for n in notes)
    for note in notes:
        assert_inert(render(note))
    table = rep.files["report.md"].read_text().split("## Summary")[1].split("##")[0]
    assert "time/token (ms)" in table and "perplexity" not in table and "pass@1" not in table
    assert all(not (isinstance(c, float) and math.isnan(c)) for row in rep.summary for c in row[4:])


LONG_CPU = 'Intel(R) Xeon(R) Processor, a "long" name @ 2.10GHz (stepping 8, microcode 0x2b000590)'


@pytest.mark.alone  # its neighbour is the only load it may count
def test_a_busy_sweep_is_measured_again_and_marked_where_its_figures_are_shown(tmp_path, monkeypatch):
    """A one-round sweep beside a real CPU-burning neighbour: its busy round is measured again
    (busy_reruns), and where every round stayed busy the view's description, its busy column, the parent's
    best speedup, the report's tables and its plots say so first. Under a long CPU name holding a comma
    and quotes, summary.csv parses back cell for cell and every plot keeps its text inside the image."""
    import csv

    import pandas

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = [
        "-m",
        "model=tiny-llama",
        "task=benchmark",
        "task.limit=2",
        "task.min_time_s=0.6",  # two prompts: over the second needed to tell others' CPU, on any host
        "hardware=phx",
        "precision=fp32,bf16",
        "busy_reruns=1",
        f"tracking.uri={store}",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
    ]
    with spinning_neighbours(1):
        out = run_cli(
            args, env={"QUANTSPEC_CPU_NAME": LONG_CPU, "QUANTSPEC_CACHE": str(fresh_cache(tmp_path / "cache"))}
        )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "1 of 1 rounds ran on a busy host (host_busy); measuring round 2 (1 of at most 1 more)" in out.stdout
    assert "sweep done: 4 finished" in out.stdout  # 2 jobs x (1 round + 1 measured again)

    client = MlflowClient(store)
    exp = client.get_experiment_by_name("quantspec")
    shown = {
        r.data.tags["precision"]: r for r in client.search_runs([exp.experiment_id], "tags.`quantspec.shown` = 'true'")
    }
    bf16 = shown["bf16"].data
    assert bf16.tags["mlflow.note.content"].startswith("⚠ BUSY job+baseline · "), bf16.tags["mlflow.note.content"]
    assert bf16.metrics["busy"] == 1.0 and shown["fp32"].data.metrics["busy"] == 1.0
    view = json.loads(client.get_experiment(exp.experiment_id).tags["mlflow.sharedViewState.latest"])
    assert "metrics.`busy`" in view["selectedColumns"]
    assert all("⚠ BUSY" in c["displayName"] for c in view["compareRunCharts"])
    parent = client.get_run(bf16.tags["mlflow.parentRunId"]).data
    assert "BUSY" in parent.tags["best_speedup_condition"]

    # the report, built again in this process to look at its figures as drawn
    drawn = []  # each plot's name, the box of everything it drew and its canvas, in inches, as saved
    real_save = plots._save
    monkeypatch.setattr(
        plots,
        "_save",
        lambda fig, path: (
            real_save(fig, path),
            drawn.append((path.name, fig.get_tightbbox(), fig.get_size_inches())),
        ),
    )
    rep = report.build(store, "quantspec", None, {"precision": "fp32", "draft": "none"}, tmp_path / "reports")
    text = rep.files["report.md"].read_text()
    assert "\\[⚠ BUSY job+baseline\\] tiny-llama·phx·bf16" in text  # a cell is text: its brackets escaped
    assert {"speedup.png", "time_per_token_ms_vs_prompt.png", "prefill_ms_vs_prompt.png"} <= {n for n, _, _ in drawn}
    for name, box, (width, height) in drawn:
        assert box.x0 >= -0.01 and box.y0 >= -0.01 and box.x1 <= width + 0.01 and box.y1 <= height + 0.01, name
    # summary.csv: every row as many cells as the header, the ran-on cell whole, comma and quotes included
    rows = list(csv.reader(rep.files["summary.csv"].open()))
    assert len({len(r) for r in rows}) == 1 and len(rows) == 3
    ran_on = rows[0].index("ran on")
    assert all(r[ran_on] == f"phx profile, ran on host CPU ({LONG_CPU})" for r in rows[1:])
    frame = pandas.read_csv(rep.files["summary.csv"])
    assert list(frame.columns) == rows[0] and len(frame) == 2
    assert all(LONG_CPU in v for v in frame["ran on"])


def _run(key, rnd, tpt, busy=False, precision="bf16"):
    return job_record(key, rnd, tpt, busy=busy, precision=precision, ran_on=f"host CPU ({LONG_CPU})")


@pytest.mark.parametrize(
    "rounds, said",
    [
        ([(False, True, 80.0)], "⚠ BUSY baseline, 1 round · 2.91× over fp32 · bf16"),  # the case
        ([(False, False, 46.0)], "1 round · 1.67× over fp32 · bf16"),
        ([(True, False, 46.0)], "⚠ BUSY, 1 round · 1.67× over fp32 · bf16"),
        ([(False, False, 46.0), (False, False, 44.0), (False, True, 90.0)], "1.64× over fp32 (1.6–1.67×) · bf16"),
    ],
)
def test_a_speedups_condition_comes_first_in_its_description(rounds, said):
    from src.tracking.readback.compare import JobRounds, speedups

    base = JobRounds(
        "fp32", [_run("fp32", r, tpt, busy=b, precision="fp32") for r, (_, b, tpt) in enumerate(rounds, 1)]
    )
    job = JobRounds("bf16", [_run("bf16", r, 27.5, busy=b) for r, (b, _, _) in enumerate(rounds, 1)])
    gain = next(u for u in speedups([base, job], {"precision": "fp32"}) if u.job is job)
    text = report.describe(job, gain, {"precision": "fp32"})
    assert text.startswith(said), text
    assert ("BUSY" in said) == report.busy_figure(job, gain)
