"""What the tests share, in one module (the fixtures built from it are in tests/conftest.py): composing the real
conf/ tree, running a command in this process or as a real one, the kernels' build directory, throwaway stores,
a tracking server, and records built by hand. No test module imports another."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from src.assembly import schema  # noqa: F401 - the groups' schemas, which every composition is typed by
from src.models.gguf_names import gguf_name
from tests.support.inprocess import Ran, run_in_process

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"


def compose_job(overrides: list[str]) -> tuple[dict, dict]:
    """The resolved job config (without hydra's node) and Hydra's group choices, as src.run sees them."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
        choices = {k: v for k, v in cfg.hydra.runtime.choices.items() if not k.startswith("hydra") and v}
        # hydra's own node has job-time fields (hydra.job.num) that only a launcher fills in.
        raw = {
            k: OmegaConf.to_container(cfg[k], resolve=True) if OmegaConf.is_config(cfg[k]) else cfg[k]
            for k in cfg
            if k != "hydra"
        }
    return raw, choices


def overridden(base: list[str], *args: str) -> list[str]:
    """`base`'s overrides with `args` after them, each key of `args` taken out of `base` first: a command line
    gives a setting once (src.run refuses one given twice)."""
    keys = {a.partition("=")[0] for a in args}
    return [*(a for a in base if a.partition("=")[0] not in keys), *args]


def run_cli(args: list[str], module: str = "src.run", env: dict | None = None, cwd: Path | None = None) -> Ran:
    """`python -m <module> *args` (src.run, src.report, src.regress or src.sync) run in this process, with `env`
    added to its environment: exit code, stdout and stderr as a child's would be. For a test of what a command
    says, returns and records; a test of the process itself (a signal, a kill, a lock held by another process, a
    timeout) starts a real one with run_process."""
    return run_in_process(args, module, env, cwd)


def run_process(
    args: list[str], timeout: int = 600, module: str = "src.run", cwd: Path = ROOT, env: dict | None = None
) -> subprocess.CompletedProcess:
    """`python -m <module> *args` as a real child process (tests/e2e/): where the process is what is tested."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cli_env(env),
    )


def cli_env(extra: dict | None = None) -> dict:
    """The environment of a quantspec child process, importable from any working directory."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), **(extra or {})}


# The kernels' build directory of the runtime's own cache: built once per machine (CI compiles it for the tests and
# the main command); the kernel tests load each variant from it.
KERNELS = Path(os.environ.get("QUANTSPEC_CACHE", "~/.cache/quantspec")).expanduser() / "kernels"


def use_variant(name: str) -> str:
    """Load kernel variant `name` from KERNELS for this process: skipped, with the reason, where this CPU lacks its
    instructions; a failure where it cannot be built."""
    import torch

    from src import kernels
    from src.kernels import variants

    lacks = variants.missing(variants.by_name(name), variants.cpu_features())
    if lacks:
        pytest.skip(f"this CPU lacks {', '.join(lacks)}: the {name} kernels cannot run here")
    if not kernels.load_variants(KERNELS, [variants.by_name(name)]):
        pytest.fail(f"the {name} kernels could not be built: {kernels.reason()}")
    assert torch.ops.quantspec.variant() == name
    return name


@functools.cache
def bwrap_problem() -> str | None:
    """Why bubblewrap cannot run here (scripts/setup installs it as root; a host may still forbid it), or None."""
    from src.tasks import sandbox

    try:
        sandbox.check("bwrap")
    except sandbox.SandboxUnavailable as err:
        return str(err)
    return None


def skip_without_bwrap():
    """The mark that skips a test, saying why, where bubblewrap cannot run."""
    return pytest.mark.skipif(bwrap_problem() is not None, reason=f"bubblewrap cannot run here: {bwrap_problem()}")


def calib(tok, n: int = 4, length: int = 64):
    """Calibration batches for a tiny model's quantization: code, as the default corpus is."""
    from src.quant import calibrate

    text = "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n" * 40
    return calibrate.calibration_ids(tok, text, n, length)


def fresh_cache(path: Path, kernels: bool = True) -> Path:
    """A cache directory of its own for a test's jobs (their QUANTSPEC_CACHE or cache_dir), holding what this
    test session made once: the kernels (a job's own kernel build takes ~20 s here, and only the tests of kernel
    builds, tests/e2e/test_faults.py, need to watch one happen; `kernels=False` leaves them out) and the empty
    tracking store every new store is copied from (src.tracking.store.blank: 2.8 s to make here). Copies, not
    links: a test may damage or lock what is in its cache. Called again on the same path it leaves the kernels
    there as they are: a command run in this process may have loaded them, and a loaded library written over in
    place crashes the process."""
    from src import kernels as built
    from src.tracking.store import blank

    if kernels and not (path / "kernels").exists() and built.load(KERNELS):  # built once for the session
        shutil.copytree(KERNELS, path / "kernels", ignore=shutil.ignore_patterns(".*.lock"))
    template = blank.empty_template()  # the session's own cache: made once
    if template is not None and not (path / "stores" / template.name).exists():
        (path / "stores").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(template, path / "stores" / template.name)
    return path


def quant_spec(method: str, scheme: str, **fields):
    """The spec of `method` (src.quant.methods.METHODS) with conf/precision/_fields.yaml's defaults (the one
    place they live) under `fields`."""
    import dataclasses

    from src.quant.methods import METHODS

    cls = METHODS[method]
    defaults = OmegaConf.to_container(OmegaConf.load(CONF / "precision" / "_fields.yaml"))
    names = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in defaults.items() if k in names}
    values.update(method=method, scheme=scheme, **fields)
    values["int8_linears"] = tuple(values["int8_linears"])
    values["gptq"] = tuple(values["gptq"])
    return cls(**values)


def job_record(
    key: str,
    rnd: int,
    time_per_token_ms: float,
    busy: bool = False,
    outcome: str = "finished",
    precision: str = "w8a8",
    **tags,
):
    """One round of a job as the report reads it back from the store (src.tracking.readback.sweeps.JobRecord), built
    by hand: its identity across rounds, round, busy flag, outcome and choices, its time per token."""
    from src.tracking.readback.sweeps import JobRecord

    tags = {
        "quantspec.config_key": key,
        "round": str(rnd),
        "host_busy": str(busy).lower(),
        "outcome": outcome,
        "precision": precision,
        "model": "m",
        "hardware": "cpu",
        "draft": "none",
        "task": "decode",
        "engine": "native",
        **tags,
    }
    return JobRecord(f"{key}-{rnd}", key, tags, {"time_per_token_ms_median": time_per_token_ms})


@contextlib.contextmanager
def spinning_neighbours(count: int = 1):
    """`count` processes spinning on a core each while the block runs: a neighbour on the host, as another user's
    work is. Not children of this process: a job run here counts its own children's CPU as its own (a runtime's
    process is its work), so a child of the test would not be a neighbour to it."""
    pids = []
    try:
        for _ in range(count):
            # the shell starts the spinner in the background and ends: the spinner is left to init, no child of ours
            out = subprocess.run(
                ["sh", "-c", f"'{sys.executable}' -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
                capture_output=True,
                text=True,
                check=True,
            )
            pids.append(int(out.stdout.strip()))
        yield pids
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def kill_session(sid: int) -> None:
    """SIGKILL to every live process of session `sid` (a process started with start_new_session=True, and all it
    started), as a cancelled CI job or a closed terminal ends them. Its process group is not enough: ninja starts
    each compiler in a group of its own, and a compiler left running takes a core for half a minute."""
    import psutil

    while True:  # again until none is left: one may start another while the first ones are killed
        found = []
        for proc in psutil.process_iter(["status"]):
            with contextlib.suppress(psutil.Error, OSError):
                if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getsid(proc.pid) == sid:
                    found.append(proc)
        if not found:
            return
        for proc in found:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(found, timeout=5)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, what: str, timeout: float = 120) -> None:
    """Until `url`/health answers; bounded, so a server that never starts fails its test, not the suite."""
    deadline = time.time() + timeout
    while True:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=2)
            return
        except OSError:
            if time.time() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail(f"{what} did not start")
            time.sleep(0.3)


def mlflow_server(where: Path, port: int) -> subprocess.Popen:
    """A real `mlflow server` (with quantspec's view page: src.tracking.view.view_app) on loopback over a SQLite
    store in `where`, in its own process group
    (so a test can kill it with its workers, as a crash would), answering when this returns."""
    mlflow = os.path.join(os.path.dirname(sys.executable), "mlflow")
    backend = where / "server.db"
    if not backend.exists():  # MLflow's schema copied from the cached empty store, not migrated anew (~3 s);
        # the server makes its Default experiment on its first open, as on any new store
        from src.tracking.store.blank import empty_template

        template = empty_template()
        if template is not None:
            shutil.copyfile(template, backend)
    proc = subprocess.Popen(
        [
            mlflow,
            "server",
            "--app-name",
            "quantspec",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--backend-store-uri",
            f"sqlite:///{backend}",
            "--artifacts-destination",
            str(where / "artifacts"),
        ],
        cwd=where,
        # no job-queue workers: MLflow starts seven (a Python process importing MLflow each, for GenAI jobs
        # quantspec never submits), as scripts/tracking-server also turns off
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    wait_healthy(f"http://127.0.0.1:{port}", proc, "mlflow server")
    return proc


def perplexity_by_engine(tmp_path: Path, engines: str, *overrides: str) -> dict[str, float]:
    """`task=perplexity` on the tiny Llama at fp32, one job per engine in `engines` (a sweep's list), in a
    store and cache of their own: each engine's perplexity."""
    from mlflow.tracking import MlflowClient

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = run_cli(
        [
            "-m",
            "model=tiny-llama",
            f"engine={engines}",
            "precision=fp32",
            "task=perplexity",
            "task.window=64",
            "task.windows=2",
            f"tracking.uri={store}",
            f"hydra.sweep.dir={tmp_path / 's'}",
            *overrides,
        ],
        env={"QUANTSPEC_CACHE": str(fresh_cache(tmp_path / "cache"))},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    client = MlflowClient(store)
    runs = client.search_runs(
        [client.get_experiment_by_name("quantspec").experiment_id], "tags.`quantspec.role` = 'job'"
    )
    return {r.data.tags["engine"]: r.data.metrics["perplexity"] for r in runs}


def fp32_export(cache: Path, runtime: str) -> tuple[Path, dict]:
    """The fp32 export a job on engine `runtime` made in `cache` (perplexity_by_engine's), and its manifest."""
    from src.common.cache import MANIFEST

    (folder,) = (p for p in (cache / runtime).glob("*-fp32*") if p.is_dir() and not p.name.startswith("."))
    return folder, json.loads((folder / MANIFEST).read_text())


def uncatalogued(store_uri: str, experiment: str = "quantspec") -> dict[str, list[str]]:
    """The metric, param and tag names the store's runs carry that src.tracking.store.catalog does not list (and so
    the docs' reference page lacks)."""
    from mlflow.tracking import MlflowClient

    from src.tracking.store import catalog

    client = MlflowClient(store_uri)
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    seen = {"metric": set(), "param": set(), "tag": set()}
    for run in runs:
        seen["metric"] |= set(run.data.metrics)
        seen["param"] |= set(run.data.params)
        seen["tag"] |= set(run.data.tags)
    return {kind: missing for kind, names in seen.items() if (missing := catalog.unlisted(kind, names))}


def doc_schema(name: str) -> dict:
    """The JSON schema docs/reference/report-json.md shows under `<!-- schema: name -->`: the code's documents are
    validated against what the reader is told."""
    text = (ROOT / "docs" / "reference" / "report-json.md").read_text()
    block = text.split(f"<!-- schema: {name} -->", 1)[1].split("```json", 1)[1].split("```", 1)[0]
    return json.loads(block)


def publish_to_hub_cache(cache: Path, repo_id: str, model, tokenizer) -> Path:
    """`model` and `tokenizer` laid out in the Hugging Face cache at `cache` as the hub's download lays them
    (models--org--name/: blobs/<sha256>, snapshots/<commit>/<file> linked to its blob, refs/main naming the
    commit): what `hf download repo_id` leaves, made offline. Returns the snapshot folder."""
    import hashlib
    import tempfile

    repo = cache / f"models--{repo_id.replace('/', '--')}"
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as saved:
        model.save_pretrained(saved)
        tokenizer.save_pretrained(saved)
        for file in Path(saved).iterdir():
            blob = repo / "blobs" / hashlib.sha256(file.read_bytes()).hexdigest()
            shutil.copyfile(file, blob)
            (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return snapshot


def write_tiny_gguf(path: Path):
    """src.models.tiny's qwen2 written as a GGUF file at `path` (float32 tensors under llama.cpp's names, its byte
    vocabulary as a gpt2-type tokenizer): a local GGUF of a served family, made in a second. Returns the model and
    tokenizer it was written from."""
    import gguf

    from src.models.tiny import tiny_model

    model, tokenizer = tiny_model("qwen2")
    c = model.config
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_rope_freq_base(float(c.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    tokens = [t for t, _ in sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])]
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in tokenizer.all_special_tokens else 1 for t in tokens])  # 3: control
    writer.add_token_scores([0.0] * len(tokens))  # no merges: transformers derives none from single bytes
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_add_bos_token(True)
    for key, value in model.state_dict().items():
        writer.add_tensor(gguf_name(key), value.float().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model, tokenizer
