"""Builds killed, raced and damaged, with real processes: the kernel library, a sweep stopped while its kernels
compile, a runtime's exporter, a quantization killed midway (it resumes at its next layer).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import sys
import time

from tests.support.cli import ROOT, cli_env, fresh_cache
from tests.support.faults import LOAD, QUICK, alive, said, start, wait_for
from tests.support.kernels import KERNELS
from tests.support.processes import kill_session


def test_kernel_builds_damaged_killed_and_raced_all_end_in_a_working_library(tmp_path):
    """A built cache is damaged (the binding truncated, as by a full disk or a killed copy; the variant's manifest
    JSON that is no manifest): the next load says so and starts again, and is killed while compiling, leaving its
    scratch folder (torch's baton, "lock", inside) behind; two loads then race: one builds, clearing the killed
    build's folder, the other waits, both load, and the variant is the same one, never a lesser. (The other damages
    go through the same check: tests/kernels/test_records.py, tests/common/test_cache.py.)"""
    from src import kernels
    from src.common.cache import MANIFEST, damage
    from src.kernels import variants

    # the session's build (made here if no test has made it yet), copied: only the damaged one is rebuilt
    ready = subprocess.run([sys.executable, "-c", LOAD, str(KERNELS)], cwd=ROOT, env=cli_env(), capture_output=True)
    assert ready.stdout.strip() == b"LOADED", ready.stderr[-2000:]
    best = kernels.candidates("auto")[0]  # the variant this CPU runs best, as a new process picks
    where = tmp_path / "kernels"
    built = [kernels.binding_folder(KERNELS), kernels.variant_folder(best, KERNELS, variants.compiler())]
    for folder in built:
        shutil.copytree(folder, where / folder.name, ignore=shutil.ignore_patterns(".*.lock"))
    (binding,) = where.glob("binding-*/quantspec_kernels.so")
    (variant,) = where.glob(f"*/qs_{best.name}.so")
    wants = {library: json.loads((library.parent / MANIFEST).read_text())["want"] for library in (binding, variant)}
    with binding.open("r+b") as f:
        f.truncate(binding.stat().st_size // 2)
    (variant.parent / MANIFEST).write_text("null")

    def load():
        return subprocess.Popen(
            [sys.executable, "-c", LOAD, str(where)],
            cwd=ROOT,
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # a session of its own: the load and the compilers it started
        )

    first = load()
    deadline = time.time() + 60  # killed while compiling: its scratch folder, torch's baton inside, is left behind
    while not list(where.glob(".binding-*.tmp/model/lock")):
        assert time.time() < deadline and first.poll() is None, "the build never started"
        time.sleep(0.1)
    time.sleep(1)
    kill_session(first.pid)  # the load and the compilers it started (left running, they slow the racers)
    _, err = first.communicate()
    assert err.count("is rebuilt") == 1 and "quantspec_kernels.so has" in err, err
    assert list(where.glob(".binding-*.tmp"))
    racing = [load(), load()]
    errs = ""
    for proc in racing:
        out, err = proc.communicate(timeout=600)
        assert out.strip() == "LOADED", err[-2000:]
        errs += err
    # the variant's manifest, found by whichever racer took its lock first and rebuilt once
    assert errs.count(f"{variant.parent.name} is rebuilt: its manifest records no files") == 1, errs
    # the best variant, never a lesser, and the variants below it its missing kernels come from (core/api.h: on an
    # AVX2 host the reference alone; on an AVX-512 one, avx_vnni's or avx2's w2a16 first)
    below = {f"qs_{v.name}.so" for v in variants.fallbacks(best, variants.cpu_features())}
    assert "qs_reference.so" in below
    assert {p.name for p in where.glob("*/qs_*.so")} == {variant.name, *below} and "not built here" not in errs
    assert not list(where.glob(".*.tmp"))  # the killed build's folder cleared by the next build
    for library in (binding, variant):
        assert damage(library.parent, wants[library]) is None


def test_a_killed_build_takes_its_exporter_with_it_and_the_next_build_clears_its_folder(tmp_path):
    """SIGKILL to a job mid-export: the exporter process (here one that would run for minutes) dies with it,
    and the next build of the same export clears the scratch folder the killed one left."""
    out, pids = tmp_path / "export", tmp_path / "exporter.pid"
    script = f"""
import sys
from pathlib import Path
from src.models.tiny import tiny_model
from src.engine.runtimes.exports import cached_export
model, tok = tiny_model("llama")
exporter = [sys.executable, "-c", "import os, time; open({str(pids)!r}, 'w').write(str(os.getpid())); time.sleep(600)"]
cached_export(Path({str(out)!r}), {{}}, model, tok, lambda work: exporter, "test")
"""
    job = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=cli_env({}))
    deadline = time.time() + 120
    while not (pids.is_file() and pids.read_text()) and job.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    assert pids.is_file() and job.poll() is None, "the exporter never started"
    exporter = int(pids.read_text())
    (scratch,) = tmp_path.glob(".export.*.tmp")
    job.kill()
    job.wait(timeout=30)
    deadline = time.time() + 10
    while alive(exporter) and time.time() < deadline:
        time.sleep(0.1)
    assert not alive(exporter), "the exporter outlived the job that started it"
    from src.engine.runtimes.exports import cached_export
    from src.models.tiny import tiny_model

    model, tok = tiny_model("llama")
    made = cached_export(
        out,
        {},
        model,
        tok,
        lambda work: [sys.executable, "-c", f"open({str(work / 'model' / 'done')!r}, 'w')"],
        "test",
    )
    assert made == out and out.is_dir() and not scratch.exists()


def test_a_sweep_stopped_while_its_kernels_compile_leaves_no_compiler_running(tmp_path):
    """SIGTERM to the sweep alone (not its process group, as a scheduler's stop of the main process) while the
    kernels compile: the job ends killed, and every compiler the build started ends with it, not seconds later."""
    import psutil

    cache = tmp_path / "cache"  # no kernels: the job builds them
    proc = subprocess.Popen(
        [sys.executable, "-m", "src.run", *QUICK[:-1], f"tracking.uri=sqlite:///{tmp_path / 'm.db'}",
         f"hydra.run.dir={tmp_path / 'out'}", "report_at_end=false"],
        cwd=ROOT, env=cli_env({"QUANTSPEC_CACHE": str(cache)}), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    me, compilers = psutil.Process(proc.pid), {}
    deadline = time.time() + 300
    try:
        while not compilers:  # a compiler proper (cc1plus), two levels below ninja or the driver
            assert proc.poll() is None and time.time() < deadline, proc.communicate()
            for p in me.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if p.name() in ("cc1plus", "cc1", "as"):
                        compilers[p.pid] = p
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        ended = time.time()
        assert proc.returncode == 143 and "stopped by SIGTERM" in err, err[-2000:]

        def running():
            alive = []
            for p in compilers.values():
                with contextlib.suppress(psutil.Error):
                    if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                        alive.append(p.name())
            return alive

        while running() and time.time() - ended < 1.0:
            time.sleep(0.05)
        assert not running(), f"compilers still running after the sweep ended: {running()}"
    finally:
        kill_session(proc.pid)


def test_a_quantization_killed_midway_resumes_at_its_next_layer_and_ends_as_an_uninterrupted_one(tmp_path):
    """SIGTERM while a 12-layer model is quantized (AWQ, then GPTQ on every linear): the job ends as killed in one
    line, its finished layers kept beside the cache; the same command then resumes at the first layer it had not
    written and the entry it makes is, file for file, the one an uninterrupted run makes."""
    args = ["model=llama-160m", "model.weights=random", "precision=w4a16", "precision.awq_grid=4",
            "precision.calib_samples=4", "precision.calib_seq_len=64", "task=quantize", "engine.kernels=aten"]  # fmt: skip
    runs_dir = tmp_path / "runs"
    proc = start([*args, f"hydra.run.dir={runs_dir / 'cut'}"], tmp_path, "cut")
    wait_for(tmp_path / "cut.out", "quantized layer 3 of 12", proc, timeout=300)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 143
    err = (tmp_path / "cut.err").read_text()
    assert len(said(err)) == 1 and "stopped by SIGTERM" in said(err)[0] and "Traceback" not in err
    quantized = tmp_path / "cache" / "quantized"
    (partial,) = quantized.glob(".*.partial")
    assert not [p for p in quantized.iterdir() if not p.name.startswith(".")], "no entry from a partial"
    again = start([*args, f"hydra.run.dir={runs_dir / 'again'}"], tmp_path, "again")
    assert again.wait(timeout=600) == 0, (tmp_path / "again.err").read_text()[-2000:]
    log = (tmp_path / "again.out").read_text()
    assert "resuming the quantization" in log and "quantized layer 1 of 12 " not in log
    (entry,) = [p for p in quantized.iterdir() if not p.name.startswith(".")]
    whole_cache = tmp_path / "whole"
    whole = subprocess.run(
        [sys.executable, "-m", "src.run", *args, f"hydra.run.dir={runs_dir / 'whole'}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=cli_env({"QUANTSPEC_CACHE": str(fresh_cache(whole_cache))}),
        timeout=600,
    )
    assert whole.returncode == 0, whole.stderr[-2000:]
    (reference,) = [p for p in (whole_cache / "quantized").iterdir() if not p.name.startswith(".")]
    names = sorted(p.name for p in reference.glob("*.safetensors"))
    assert names == sorted(p.name for p in entry.glob("*.safetensors")) and len(names) == 13
    for name in names:
        assert (entry / name).read_bytes() == (reference / name).read_bytes(), name
