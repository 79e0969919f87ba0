"""Benchmark results as docs pages (src.common.benchpage): appended, never rewritten; the latest shown first, the
earlier ones collapsed; a damaged results file said in one line."""

import dataclasses

import pytest

from src.common import benchpage


def _entry(title: str, date: str) -> benchpage.Entry:
    return benchpage.Entry(
        title=title,
        body="| a | b |\n|---|---|\n| 1 | 2 |\n",
        date=date,
        commit="abc123",
        host="Some CPU, 2 cores",
        flags=["avx2", "fma"],
        command=".venv/bin/python scripts/x.py",
        rounds=3,
    )


def test_each_question_shows_its_latest_current_entry_and_the_rest_is_history(tmp_path):
    entries = [
        _entry("decode", "2026-11-01"),
        _entry("decode", "2026-11-02"),
        dataclasses.replace(_entry("decode", "2026-11-03"), commit="def456-dirty"),  # uncommitted changes
        dataclasses.replace(_entry("decode", "2026-11-04"), origin="the README", flags=[]),  # carried over
        _entry("prefill", "2026-11-02"),
    ]
    for item in entries:
        benchpage.append("page", item, results=tmp_path)
    loaded = benchpage.load("page", results=tmp_path)
    assert [e.date for e in loaded] == [e.date for e in entries]
    assert [(e.title, e.date) for e in benchpage.latest(loaded)] == [
        ("prefill", "2026-11-02"),
        ("decode", "2026-11-02"),
    ]
    text = benchpage.render(loaded)
    assert text.startswith("## Latest: prefill") and "## Latest: decode" in text
    assert "CPU flags `avx2 fma`" in text and "3 rounds in turns" in text and "commit `abc123`" in text
    assert "Some CPU, 2 cores (AVX2 + FMA)" in text
    history = text[text.index("## History") :]
    notes = [line for line in history.splitlines() if line.startswith("??? note")]
    assert [n.split("; ")[-1] for n in notes] == [
        'carried over, host and flags as its text says)"',
        'measured with uncommitted changes)"',
        'superseded)"',
    ]
    assert "\n    | a | b |" in history  # a collapsed entry's table stays inside its block


def test_a_page_with_no_current_entry_says_so_and_shows_none_as_latest(tmp_path):
    text = benchpage.render([dataclasses.replace(_entry("decode", "2026-11-01"), commit="abc-dirty")])
    assert "## Latest" not in text and "No current result" in text and "## History" in text


def test_the_host_is_named_by_its_cpu_and_the_isa_that_picks_the_kernels():
    assert (
        benchpage.isa(["avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_int8"]) == "AVX-512 VNNI/BF16, AMX"
    )
    assert benchpage.isa(["avx2", "fma", "f16c"]) == "AVX2 + FMA"
    assert benchpage.isa(["avx2", "fma", "avx_vnni"]) == "AVX2 + AVX-VNNI + FMA"
    assert benchpage.isa(["asimd", "asimddp"]) == "Arm NEON + dot product"
    assert benchpage.isa([]) == "flags not recorded"


def test_a_page_without_results_says_how_to_make_one(tmp_path):
    assert "doc=true" in benchpage.render(benchpage.load("none", results=tmp_path))


def test_a_damaged_results_line_is_named(tmp_path):
    (tmp_path / "page.jsonl").write_text('{"title": "x"\n')
    with pytest.raises(ValueError, match=r"page.jsonl:1: not a benchmark entry"):
        benchpage.load("page", results=tmp_path)


def test_an_entry_records_this_host_and_the_command_without_doc():
    item = benchpage.entry("t", "body", rounds=2, argv=["scripts/bench_x.py", "rounds=2", "doc=true"])
    assert item.command == ".venv/bin/python -m scripts.bench_x rounds=2" and item.rounds == 2
    assert item.host.endswith("cores") and len(item.date) == 10
    assert benchpage.host_flags("flags\t\t: fpu avx2 avx512f fma\n") == ["avx2", "fma", "avx512f"]


def test_values_from_the_host_cannot_break_the_page():
    """A CPU name holding a quote, a newline, a `|` and HTML (QUANTSPEC_CPU_NAME, a VM's odd model string): shown as
    text; no heading injected, no admonition title closed early, no raw HTML, no table split."""
    from src.common.metrics import markdown_table

    evil = 'AMD "Epyc"\n## injected <img src=x onerror=alert(1)> a|b'
    old = benchpage.Entry(
        title=f"on {evil}", body="body", date="d", commit="c`1", host=evil, flags=["avx2"], command="x\ny"
    )
    page = benchpage.render([old, dataclasses.replace(old)])
    lines = page.splitlines()
    assert [line for line in lines if line.startswith("#")] == [lines[0], "## History"]
    assert "<img" not in page and "&lt;img" in page
    (note,) = [line for line in lines if line.startswith("??? note")]
    assert note.count('"') == 2 and note.endswith('"')
    assert "*Command*: `x y`" in page and "commit `` c`1 ``" in page
    table = markdown_table(["cpu", "ms"], [[evil, 1.0]]).splitlines()
    assert len(table) == 3 and all(line.count(" | ") == 1 for line in (table[0], table[2]))  # two cells a row


def test_doc_true_is_refused_on_a_tree_with_uncommitted_code_before_anything_is_measured(monkeypatch, capsys):
    from scripts import bench
    from src.common.settings import Setting

    cmd = bench.command("bench_x", "doc", [Setting("rounds", 3, "rounds")])
    monkeypatch.setattr(bench, "git_commit", lambda: "0123abcd-dirty")
    with pytest.raises(SystemExit) as stop:
        bench.parse(cmd, ["rounds=2", "doc=true"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "doc=true" in err[0] and "commit or stash" in err[0]
    args, _ = bench.parse(cmd, ["rounds=2"])  # without doc=true the same tree is measured as it is
    assert args.rounds == 2 and not args.doc


def test_a_benchmark_result_just_recorded_does_not_make_the_tree_dirty(tmp_path, monkeypatch):
    import subprocess

    from src.common import environment

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    git("config", "user.email", "t@t")
    git("config", "user.name", "t")
    results = tmp_path / environment.RESULTS_DIR
    results.mkdir(parents=True)
    (results / "page.jsonl").write_text("{}\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", "-A")
    git("commit", "-qm", "c")
    monkeypatch.setattr(environment, "PROJECT_ROOT", tmp_path)
    (results / "page.jsonl").write_text("{}\n{}\n")
    assert not environment.git_commit().endswith("-dirty")
    (tmp_path / "code.py").write_text("x = 2\n")
    assert environment.git_commit().endswith("-dirty")


def test_a_sweeps_entry_records_the_rounds_its_command_asked_for():
    from pathlib import Path

    from scripts.bench import Sweep

    assert Sweep(Path("s"), ["-m", "precision=fp32,w8a8", "rounds=3"], 0).rounds == 3
    assert Sweep(Path("s"), ["-m", "precision=fp32"], 0).rounds is None  # one run, as the page then says


def test_a_sweeps_figures_stand_on_its_quiet_rounds_and_its_entry_says_what_was_busy():
    from pathlib import Path

    from scripts.bench import Sweep
    from src.tracking.readback.sweeps import JobRecord

    def job(precision, round_, busy, ms):
        tags = {"precision": precision, "outcome": "finished", "round": str(round_), "host_busy": str(busy).lower()}
        return JobRecord(f"r{precision}{round_}", "n", tags, {"time_per_token_ms_median": ms})

    quiet_sweep = Sweep(Path("s"), ["-m"], 0, [job("fp32", 1, False, 40.0), job("w8a8", 1, False, 10.0)])
    assert quiet_sweep.load == "" and quiet_sweep.measured_rounds == 1
    sweep = Sweep(
        Path("s"),
        ["-m"],
        0,
        [
            job("fp32", 1, True, 90.0),
            job("w8a8", 1, False, 11.0),
            job("fp32", 2, False, 41.0),
            job("w8a8", 2, False, 9.0),
        ],
    )
    figures = sweep.by("precision")
    assert figures[("fp32",)]["time_per_token_ms_median"] == 41.0  # the busy round left out
    assert figures[("w8a8",)]["time_per_token_ms_median"] == 10.0  # the median of its quiet rounds
    assert (
        sweep.load.startswith("1 of 4 job runs timed while other processes used the CPU") and "2 rounds" in sweep.load
    )
    every_round_busy = Sweep(Path("s"), ["-m"], 0, [job("fp32", 1, True, 90.0), job("fp32", 2, True, 70.0)])
    assert every_round_busy.by("precision")[("fp32",)]["time_per_token_ms_median"] == 80.0  # kept, as nothing quiet


def test_a_sweep_src_run_refuses_ends_a_benchmark_in_that_one_line(tmp_path, monkeypatch, capfd):
    """The script runs here; the src.run it starts is its own process (their chain is what is tested, so its
    stderr is read at the file descriptor). A word that is no override had ended in src.run's traceback, then the
    script's own ("no experiment 'quantspec'")."""
    from scripts import bench_quant

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'm.db'}")
    assert bench_quant.main(["rounds=1", "bogus"]) == 2
    err = capfd.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines() == [
        "quantspec: 'bogus' is not an override: overrides are key=value (e.g. model=llama-160m, precision=w8a8)"
    ], err[-2000:]
    assert not (tmp_path / "m.db").exists()  # nothing ran, nothing recorded
