"""Bad input gets one line that says what to do, before any run is recorded where it is a config error;
paths built from user strings stay in their folders."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from src.assembly.config import ConfigError, job_config_from_dict
from src.tracking.sweep.record import run_job
from tests.support.cli import compose_job, fresh_cache, overridden, run_cli

QUICK = ["model=tiny-llama", "task.limit=1", "task.max_new_tokens=2", "task.warmup=0", "engine.kernels=aten"]


def one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.startswith("quantspec:")]
    assert len(lines) == 1, text[-2000:]
    assert "Traceback" not in text
    return lines[0]


@pytest.mark.parametrize(
    "override, words",
    [
        ("task.max_new_tokens=abc", "task.max_new_tokens='abc' must be an integer"),
        ("hardware.threads=1.5", "hardware.threads=1.5 must be an integer (or null)"),
        ("sampling.temperature=hot", "sampling.temperature='hot' must be a number"),
        ("model.name=../../outside", "model.name='../../outside' must be letters, digits"),
        ("model.source=gguf_package model.id=os", "model.id='os' is not a GGUF model package"),
        ("task.foo=1", "task.foo is not a setting of task decode; its settings: code_max_new_tokens"),
        (
            "engine.isa=sse9",
            "engine.isa='sse9' is not one of: auto, avx512, avx_vnni, avx2, neon_dotprod, neon, reference",
        ),
        ("sampling.do_sample=true sampling.temperature=nan", "sampling.temperature=nan must be a finite number"),
        ("sampling.do_sample=true sampling.temperature=1e-320", "sampling.temperature=1e-320 must be a finite number"),
        ("tracking.busy_cores=nan", "tracking.busy_cores=nan must be a finite number"),  # would flag no round busy
        ("task.min_time_s=inf", "task.min_time_s=inf must be a finite number"),
        ("sampling.seed=100000000000000000000000", "sampling.seed=100000000000000000000000 must be in [0, 2**63)"),
        ("sampling.seed=1e23", "sampling.seed=1e+23 must be an integer"),
        ("experiment=", "experiment='' must be 1 to 200 printable characters"),
        ("experiment='" + "é" * 300 + "'", "must be 1 to 200 printable characters"),
        ("experiment=" + "é" * 300, "cannot read the override 'experiment=ééé"),
        ("task=benchmark dataset.max_mb=0", "dataset.max_mb=0 must be at least 1"),
        # decode reads the seed prompts: a dataset given to it had been recorded as if read, exit 0
        ("dataset=textfile dataset.path=/nope", "dataset=... is read by no job here: task decode reads no dataset"),
        ("task=benchmark_code dataset.path=/nope", "dataset.path=... is read by no job here: task benchmark_code"),
        ("bogus", "'bogus' is not an override: overrides are key=value"),  # had been Hydra's parse traceback
        # beyond what setrlimit holds: every completion, a correct one too, had been scored failed, exit 0
        (
            "task=benchmark_code task.sandbox_timeout_s=1e300",
            "task.sandbox_timeout_s=1e+300 must be above 0 and at most",
        ),
        ("task=benchmark_code task.sandbox_memory_mb=99999999999", "task.sandbox_memory_mb=99999999999 from 64 to"),
        # past what their users hold: an overflow ("Overflow when unpacking long long") after the job had started
        (
            "hardware.threads=100000000000000000000000",
            "hardware.threads=100000000000000000000000 must be from 1 to 4096",
        ),
        ("precision.calib_samples=100000000000000000000000", "precision.calib_samples=100000000000000000000000 must"),
        ("precision.prefill_activations=int4", "precision.prefill_activations='int4' is not one of: bf16, int8"),
        ("tracking.system_metrics_s=1e300", "tracking.system_metrics_s=1e+300 must be from 0 to 3600 (0: off)"),
        # or a job, or a sweep, that never ends
        ("task.warmup=100000000000000000000000", "task.warmup=100000000000000000000000 must be from 0 to 10000"),
        ("rounds=100000000000000000000000", "rounds=100000000000000000000000 must be from 1 to 1000"),
        # before any runtime's own unsupported(): a runtime never sees a draft
        ("engine=openvino draft=prompt_lookup", "draft=prompt_lookup runs on quantspec's engine; use engine=native"),
        (
            "engine=openvino engine.kernels=aten",
            "engine.kernels is read by quantspec's own engines (hf, native), not by engine openvino",
        ),
    ],
)
def test_config_errors_are_one_line_and_record_no_run(tmp_path, override, words):
    db = tmp_path / "m.db"
    # a sweep of two jobs with the same mistake: still one line
    # engine.kernels is quantspec's own engines' field: another runtime's job does not read it (refused)
    quick = [a for a in QUICK if not (a.startswith("engine.") and "engine=" in override)]
    out = run_cli(
        [
            "-m",
            *overridden(quick, *override.split()),
            "precision=fp32,bf16",
            f"tracking.uri=sqlite:///{db}",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
        ],
        env={"QUANTSPEC_CACHE": str(fresh_cache(tmp_path / "cache"))},
    )
    assert out.returncode in (1, 2)
    assert words in one_line(out.stderr)
    assert not db.exists() or not MlflowClient(f"sqlite:///{db}").search_runs(
        [MlflowClient(f"sqlite:///{db}").get_experiment_by_name("quantspec").experiment_id]
    )
    assert not (tmp_path.parent / "outside").exists()


def test_empty_local_path_says_what_is_missing():
    out = run_cli(["model=llama-2-7b", "model.local_path="])
    assert "model.local_path is empty" in one_line(out.stderr)


def _failed_reason(store: str, extra: list[str], capsys) -> str:
    raw, choices = compose_job([*QUICK, f"tracking.uri={store}", *extra])
    assert (
        run_job(raw, choices, sweep=None, output_dir=Path(store.removeprefix("sqlite:///")).parent / "out") == "failed"
    )
    line = one_line(capsys.readouterr().err)
    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("quantspec").experiment_id])
    assert run.info.status == "FAILED" and run.data.tags["outcome_reason"].split(": ", 1)[1] in line
    return line


def test_forcing_a_kernel_variant_this_cpu_lacks_fails_the_job_in_one_line(store, capsys):
    import platform

    other = "neon" if platform.machine() == "x86_64" else "avx512"
    raw, choices = compose_job(
        [q for q in QUICK if not q.startswith("engine.")]
        + [f"tracking.uri={store}", "engine.kernels=quantspec", f"engine.isa={other}"]
    )
    assert (
        run_job(raw, choices, sweep=None, output_dir=Path(store.removeprefix("sqlite:///")).parent / "out") == "failed"
    )
    line = one_line(capsys.readouterr().err)
    assert f"engine.isa={other}: this CPU lacks" in line and "choose engine.isa=auto or one of:" in line


def test_a_text_file_that_is_not_utf8_names_the_file_and_the_problem(store, tmp_path, capsys):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("déjà vu, ça va\n".encode("latin-1") * 100)
    line = _failed_reason(
        store, ["task=benchmark", "task.prompt_lengths=[8]", "dataset=textfile", f"dataset.path={bad}"], capsys
    )
    assert str(bad) in line and "is not UTF-8 text (byte 0xe9" in line


@pytest.mark.parametrize(
    "extra, words",
    [
        (["task.max_new_tokens=700"], "task.max_new_tokens=700 with a "),
        (["task=perplexity", "task.window=2048"], "task.window=2048 exceeds tiny-llama's context of 512 tokens"),
        (["task=benchmark", "task.prompt_lengths=[600]"], "no prompt length of task benchmark fits"),
    ],
)
def test_work_past_the_model_s_context_is_refused_before_timing(store, capsys, extra, words):
    assert words in _failed_reason(store, extra, capsys)


def test_a_sweep_directory_with_a_quote_works_and_reports(tmp_path):
    store = f"sqlite:///{tmp_path / 'm.db'}"
    here = tmp_path / "it's here"  # the working directory: the default sweep directory lies under it
    here.mkdir()
    out = run_cli(["-m", *QUICK, "precision=fp32,bf16", f"tracking.uri={store}"], cwd=here)
    assert out.returncode == 0, out.stderr[-2000:]
    (sweep,) = here.glob("multirun/*/*")
    from src.tracking.readback.sweeps import sweep_jobs

    assert len(sweep_jobs(store, sweep_id=str(sweep.resolve()))[1]) == 2
    named = tmp_path / "it's named"
    out = run_cli(["-m", *QUICK, f"tracking.uri={store}", f'hydra.sweep.dir="{named}"'])
    assert out.returncode == 0, out.stderr[-2000:]
    assert len(sweep_jobs(store, sweep_id=str(named))[1]) == 1


def test_a_report_stays_in_its_folder_whatever_the_parent_is_named(tmp_path):
    store = f"sqlite:///{tmp_path / 'm.db'}"
    out = run_cli(["-m", *QUICK, f"tracking.uri={store}", f"hydra.sweep.dir={tmp_path / 'sweep'}"])
    assert out.returncode == 0, out.stderr[-2000:]
    from src.tracking.readback import reporting as report
    from src.tracking.readback.sweeps import sweep_jobs

    parent_id, _ = sweep_jobs(store)
    MlflowClient(store).update_run(parent_id, name="x/../../../outside")
    built = report.build(store, "quantspec", None, {"precision": "fp32"}, tmp_path / "reports")
    assert built.files["report.md"].resolve().is_relative_to((tmp_path / "reports").resolve())
    assert not (tmp_path.parent.parent / "outside").exists()


def test_a_job_with_many_overrides_gets_a_directory_name_the_file_system_takes():
    from src.run import short_dirname

    many = ",".join(f"precision.field_{i}=value_{i}" for i in range(30))  # ~700 bytes: over NAME_MAX
    name = short_dirname(many)
    assert len(name.encode()) <= 120 and name.startswith("precision.field_0=value_0")
    assert short_dirname(many.replace("value_29", "other")) != name  # cut, yet still one name per job
    assert short_dirname("precision=w8a8,task=decode") == "precision=w8a8,task=decode"


def test_a_sweep_counts_the_jobs_its_config_refused(store, tmp_path):
    # temperature 0 is refused in one line and gets no run; the store cannot count it, the summary does
    out = run_cli(
        [
            "-m",
            *QUICK,
            "sampling.do_sample=true",
            "sampling.temperature=1.0,0",
            f"tracking.uri={store}",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
            "report_at_end=false",
        ]
    )
    assert out.returncode == 1
    assert "sampling.temperature=0" in out.stderr and "must be a finite number of at least 0.001" in out.stderr
    assert "sweep done: 1 finished, 0 skipped, 0 failed; 1 refused by their config before a run" in out.stdout


def test_user_strings_in_overrides_stay_inside_the_sweep_directory(tmp_path):
    sweep = tmp_path / "deep" / "sweep"
    out = run_cli(
        [
            "-m",
            *QUICK,
            "experiment=../../../escaped,plain",
            f"tracking.uri=sqlite:///{tmp_path / 'm.db'}",
            f"hydra.sweep.dir={sweep}",
            "report_at_end=false",
        ],
        env={"QUANTSPEC_CACHE": str(fresh_cache(tmp_path / "cache"))},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    assert len(jobs) == 2 and "experiment=.._.._.._escaped," in jobs[0] and "/" not in jobs[0], jobs
    assert not (tmp_path / "escaped").exists() and not list(tmp_path.glob("**/escaped*"))


def test_inputs_past_their_limits_are_said_in_one_line(tmp_path, store):
    env = {"QUANTSPEC_CACHE": str(fresh_cache(tmp_path / "cache"))}
    big = tmp_path / "big.txt"
    big.write_text("def f(x):\n    return x\n" * 100_000)  # 2.3 MB
    out = run_cli(
        [
            *QUICK,
            "task=benchmark",
            "task.prompt_lengths=[8]",
            "dataset=textfile",
            f"dataset.path={big}",
            "dataset.max_mb=1",
            f"tracking.uri={store}",
            f"hydra.run.dir={tmp_path / 'big'}",
        ],
        env=env,
    )
    assert out.returncode == 1 and "over dataset.max_mb=1; cut it" in one_line(out.stderr)
    # a cache that is a file, not a directory: refused before any run
    cache = tmp_path / "cache-file"
    cache.write_text("x")
    out = run_cli([*QUICK, f"tracking.uri={store}"], env={"QUANTSPEC_CACHE": str(cache)})
    assert out.returncode == 1 and f"cache_dir={cache} is a file" in one_line(out.stderr)
    # a local model whose config.json is damaged: said so, not "the hub is unreachable"
    model = tmp_path / "model"
    model.mkdir()
    cases = [
        ("{not json", "config.json cannot be read as JSON"),
        ("null", "config.json holds NoneType, not a model's config"),  # JSON, but no config: not a TypeError
        # a size transformers does not check: -5 had ended in "Class validation error for validator", its reason
        # only in a tag; -8 had blamed the tokenizer
        ('{"model_type": "llama", "hidden_size": -5}', "config.json has hidden_size=-5, but a model's sizes are"),
        ('{"model_type": "llama", "hidden_size": -8}', "config.json has hidden_size=-8, but a model's sizes are"),
        ('{"model_type": "llama", "num_hidden_layers": 2.5}', "has num_hidden_layers=2.5, but"),
    ]
    for i, (text, words) in enumerate(cases):
        (model / "config.json").write_text(text)
        out = run_cli(
            [
                *overridden(QUICK, "model=llama-2-7b"),
                f"model.local_path={model}",
                "model.weights=real",
                f"tracking.uri={store}",
                f"hydra.run.dir={tmp_path / f'model-run{i}'}",
            ],
            env=env,
        )
        line = one_line(out.stderr)
        assert out.returncode == 1 and words in line and "hub" not in line, line
    # random weights are built by name: a local folder given beside them was never read, yet recorded
    out = run_cli(
        [
            *overridden(QUICK, "model=llama-2-7b"),
            "model.weights=random",
            f"model.local_path={model}",
            f"tracking.uri={store}",
        ],
        env=env,
    )
    assert "model.weights=random builds llama-2-7b's published shape and never reads model.local_path" in one_line(
        out.stderr
    )
    # more threads than cores: runs, and says so in one line
    out = run_cli(
        [*QUICK, "hardware.threads=1000", f"tracking.uri={store}", f"hydra.run.dir={tmp_path / 't'}"], env=env
    )
    assert out.returncode == 0 and "hardware.threads=1000 is more than the" in out.stdout + out.stderr


ENV_PROBLEMS = [
    ({"QUANTSPEC_HEARTBEAT_S": "abc"}, "QUANTSPEC_HEARTBEAT_S='abc' must be a number of seconds from 1 to 3600"),
    ({"QUANTSPEC_HEARTBEAT_S": "inf"}, "QUANTSPEC_HEARTBEAT_S='inf' must be a number of seconds"),
    ({"QUANTSPEC_HEARTBEAT_S": "0"}, "QUANTSPEC_HEARTBEAT_S='0' must be a number of seconds"),  # a busy loop
    ({"QUANTSPEC_CACHE": ""}, "QUANTSPEC_CACHE is set but empty"),  # not the working directory
    ({"QUANTSPEC_PREFETCH": "l3"}, "QUANTSPEC_PREFETCH='l3' must be l1 or l2"),
]


@pytest.mark.parametrize(
    "module, env, words",
    [("src.sync", *problem) for problem in ENV_PROBLEMS] + [("src.report", *ENV_PROBLEMS[3])],
)
def test_environment_variables_are_checked_at_the_start_in_one_line(tmp_path, module, env, words):
    out = run_cli([], module=module, env=env, cwd=tmp_path)
    assert out.returncode == 2 and words in one_line(out.stderr), out.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []  # nothing written where it ran


def test_a_job_refuses_a_bad_environment_variable_before_it_starts(tmp_path):
    store = tmp_path / "m.db"
    for env, words in ENV_PROBLEMS[::2]:
        out = run_cli([*QUICK, f"tracking.uri=sqlite:///{store}", f"hydra.run.dir={tmp_path / 'run'}"], env=env)
        assert out.returncode == 2 and words in one_line(out.stderr), out.stderr[-2000:]
    assert not store.exists() and not (tmp_path / "run").exists()


def test_the_commands_that_read_a_store_say_a_store_they_cannot_read_in_one_line(tmp_path):
    """A store whose schema is behind MLflow's, and a file that is not SQLite: one line each, no traceback."""
    import sqlite3

    behind = tmp_path / "old.db"
    MlflowClient(f"sqlite:///{behind}").search_experiments(max_results=1)
    with sqlite3.connect(behind) as con:
        con.execute("update alembic_version set version_num = '451aebb31d03'")  # an older MLflow's schema
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database " * 100)
    for module, args, store, words in (
        ("src.report", [], behind, "Detected out-of-date database schema"),
        ("src.regress", ["against=x"], garbage, "is not a SQLite database"),
    ):
        out = run_cli([*args, f"tracking.uri=sqlite:///{store}"], module=module)
        assert out.returncode == 2 and words in one_line(out.stderr), out.stderr[-2000:]


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["task.limit=0"], "task.limit=0 must be at least 1 (or null: every document)"),  # num_fewshot is not blamed
        (["task.num_fewshot=-1"], "task.num_fewshot=-1 must be 0 or more"),
        # lm-eval's "Sample larger than population", after the model had loaded
        (
            ["task.num_fewshot=100000000000000000000000"],
            "task.num_fewshot=100000000000000000000000 must be from 0 to 100",
        ),
    ],
)
def test_an_lm_eval_setting_is_blamed_alone(overrides, words):
    from src.assembly.config import ConfigError, job_config_from_dict

    raw, _ = compose_job(["task=lm_eval", *overrides])
    with pytest.raises(ConfigError) as err:
        job_config_from_dict(raw)  # validated as it is converted, once, at the entry
    assert str(err.value) == words


def test_a_four_bit_head_on_a_precision_without_groups_blames_the_head():
    """precision=w8a8 precision.head_format=w4a8 had blamed precision.group_size=None, a field never set."""
    raw, _ = compose_job(["model=tiny-llama", "precision=w8a8", "precision.head_format=w4a8"])
    with pytest.raises(ConfigError, match=r"^precision.head_format=w4a8 is a 4-bit format, which quantizes in groups"):
        job_config_from_dict(raw)


@pytest.mark.parametrize(
    ("module", "args", "words"),
    [
        (
            "src.run",
            ["precision=fp32", "precision=bf16"],
            "precision is given twice (precision=fp32 and precision=bf16)",
        ),
        ("src.run", ["task.limit=1", "task.limit=2"], "task.limit is given twice"),
        ("src.report", ["out=a", "out=b"], "out is given twice (out=a and out=b); give it once"),
        ("src.sync", ["/etc/passwd"], "/etc/passwd is not a journal"),
        (
            "src.run",
            ["hydra.run.dir=/proc/quantspec-nowhere"],
            "hydra.run.dir=/proc/quantspec-nowhere cannot be written",
        ),
        ("src.run", ["-m", "hydra.sweep.dir=/proc/quantspec-nowhere/a"], "hydra.sweep.dir=/proc/quantspec-nowhere/a"),
    ],
    ids=["override-twice", "field-twice", "setting-twice", "not-a-journal", "run-dir", "sweep-dir"],
)
def test_a_command_line_that_says_a_thing_twice_or_names_what_it_cannot_read_or_write_is_one_line(
    tmp_path, module, args, words
):
    out = run_cli([*QUICK, *args] if module == "src.run" else args, module=module)
    assert out.returncode == 2 and words in one_line(out.stderr), out.stderr[-2000:]


def test_sync_of_a_folder_without_journals_is_one_line(tmp_path):
    out = run_cli([str(tmp_path)], module="src.sync")
    assert out.returncode == 2 and f"{tmp_path} holds no journal.jsonl" in one_line(out.stderr)


def test_python_m_src_serve_refuses_a_setting_given_twice(capsys):
    from src import serve

    assert serve.main(["model=tiny-gemma3", "task.port=0", "task.port=1"]) == 2
    assert "task.port is given twice" in one_line(capsys.readouterr().err)
