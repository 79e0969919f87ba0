"""The sandbox against a hostile program, with real processes: files only root may read, a fork bomb, a
flood of files, children that detach with setsid. Each case is checked on the host afterwards (what
is left running, what was written)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest

from src.tasks import sandbox
from tests.support.sandbox import skip_without_bwrap

needs_bwrap = skip_without_bwrap()
LIMITS = sandbox.Limits(timeout_s=4.0, memory_mb=512)
SANDBOXES = [pytest.param("bwrap", marks=needs_bwrap), "rlimit"]


def named(marker: str) -> str:
    """Program lines naming its process (and every child it forks) `marker`, for pgrep to find."""
    return f"import ctypes\nctypes.CDLL(None).prctl(15, {marker.encode()!r}, 0, 0, 0)\n"  # PR_SET_NAME


def left_running(marker: str) -> list[str]:
    time.sleep(0.3)
    return subprocess.run(["pgrep", "-x", marker], capture_output=True, text=True).stdout.split()


def test_left_running_sees_a_named_process():  # the check below cannot pass by seeing nothing
    marker = f"qs{uuid.uuid4().hex[:10]}"
    proc = subprocess.Popen([sys.executable, "-c", named(marker) + "import time\ntime.sleep(30)\n"])
    try:
        deadline = time.time() + 10
        while not left_running(marker):
            assert time.time() < deadline
    finally:
        proc.kill()
        proc.wait()


@needs_bwrap
def test_bwrap_reads_nothing_its_user_could_not_and_says_little(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET " * 100)
    secret.chmod(0o600)
    store = tmp_path / "mlflow.db"
    store.write_text("rows")
    store.chmod(0o600)
    for path in (secret, store, "/etc/shadow", "/root/.bashrc"):
        out = sandbox.run(f"raise SystemExit(open({str(path)!r}).read())\n", "bwrap", LIMITS)
        assert out.status == "failed" and "TOP-SECRET" not in out.detail and "rows" not in out.detail
        assert "No such file" in out.detail or "Permission denied" in out.detail, out.detail
    if os.geteuid() == 0:  # started as root: the program is nobody on the host, with no capabilities
        check = (
            "import os\nassert os.getuid() == os.geteuid() == 65534\n"
            "caps = [l for l in open('/proc/self/status') if l.startswith('Cap')]\n"
            "assert all(l.split()[1] == '0000000000000000' for l in caps), caps\n"
        )
        assert sandbox.run(check, "bwrap", LIMITS).passed
    long = sandbox.run("raise ValueError('x' * 5000)\n", "bwrap", LIMITS)
    assert len(long.detail) <= sandbox.DETAIL_CHARS


@pytest.mark.parametrize("kind", SANDBOXES)
def test_a_fork_bomb_is_capped_and_nothing_of_it_survives(kind):
    marker = f"qs{uuid.uuid4().hex[:10]}"
    bomb = (
        named(marker) + "import os, time\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n"
        "        time.sleep(0.01)\n"
    )
    began = time.monotonic()
    out = sandbox.run(bomb, kind, LIMITS)
    # the kernel's RLIMIT_NPROC makes forks fail until the time limit; where the program stayed root
    # (rlimit, an interpreter nobody may run), the supervisor's own count ends it
    # stopped by whichever limit it reaches first: the time, the process count, or their memory together
    assert out.status == "timed out" or out.detail in (
        f"started more than {sandbox.SUPERVISED} processes",
        f"its processes held more than {LIMITS.memory_mb} MB together",
    ), out
    assert time.monotonic() - began < LIMITS.timeout_s + 10
    assert left_running(marker) == []


@pytest.mark.parametrize("kind", SANDBOXES)
def test_a_child_that_detaches_with_setsid_is_killed_at_the_limit(kind):
    marker = f"qs{uuid.uuid4().hex[:10]}"
    program = (
        named(marker) + "import os, time\n"
        "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(120)\n    os._exit(0)\n"
        "time.sleep(0.5)\n"
    )  # the parent ends at once: the sandbox's end, not its time limit
    out = sandbox.run(program, kind, LIMITS)
    assert out.passed, out
    assert left_running(marker) == []


@needs_bwrap
def test_bwrap_caps_what_a_program_writes_in_all():
    flood = "for i in range(2048):\n    open(f'f{i}', 'wb').write(b'x' * (1 << 20))\n"
    before = os.statvfs("/dev/shm")
    out = sandbox.run(flood, "bwrap", LIMITS)
    assert out.status == "failed" and "No space left on device" in out.detail
    after = os.statvfs("/dev/shm")
    assert (before.f_bfree - after.f_bfree) * after.f_frsize < (64 << 20)  # nothing of it left on the host


@needs_bwrap
def test_bwrap_in_a_user_namespace_gives_up_its_mount_capability():
    """The path taken when quantspec is not root: root of its own user namespace, which mounts the capped
    /tmp and then gives up every capability, also across exec."""
    exe, _ = sandbox.interpreter()
    cmd = sandbox.bwrap_command(as_root=False) + [
        exe,
        "-I",
        "-c",
        sandbox.RUNNER,
        str(512 << 20),
        "4",
        str(1 << 20),
        "1000",
        str(1 << 20),
        "caps",
    ]
    # the runner reads the program, then the run's nonce
    status = subprocess.run(
        cmd,
        input=sandbox.job_input("import os\nos.execv('/bin/cat', ['cat', '/proc/self/status'])\n", "0" * 32),
        capture_output=True,
        timeout=30,
    )
    caps = [line.split() for line in status.stdout.decode().splitlines() if line.startswith("Cap")]
    assert len(caps) == 5 and all(value == "0000000000000000" for _, value in caps), status
    full = subprocess.run(
        cmd,
        input=sandbox.job_input(
            "open('a', 'wb').write(b'x' * 900000)\nopen('b', 'wb').write(b'x' * 900000)\n", "0" * 32
        ),
        capture_output=True,
        timeout=30,
    )
    assert b"No space left on device" in full.stderr


HUMANEVAL_0 = {
    "prompt": "def has_close_elements(numbers, threshold):\n",
    "test": "def check(candidate):\n    assert candidate([1.0, 2.8, 3.0], 0.3) is True\n    assert candidate([1.0, 2.0], 0.5) is False\n",
    "entry_point": "has_close_elements",
}
FORGE = """import gc, os, re, sys
found = set()
frame = sys._getframe()
while frame is not None:
    found.update(repr(v) for v in frame.f_locals.values())
    found.update(repr(v) for v in frame.f_globals.values())
    frame = frame.f_back
for proc in os.listdir('/proc'):  # every command line it can read: the runner's source is on its own
    try:
        found.add(open('/proc/%s/cmdline' % proc, 'rb').read().decode(errors='replace'))
    except OSError:
        pass
for o in gc.get_objects():
    try:
        found.add(repr(o)[:100000])
    except Exception:
        pass
hexes = set()
for text in found:
    hexes.update(re.findall(r'[0-9a-f]{32}', text))
pids = [p for p in os.listdir('/proc') if p.isdigit()]
for pid in pids:
    try:
        with open('/proc/%s/maps' % pid) as maps, open('/proc/%s/mem' % pid, 'rb', buffering=0) as mem:
            for line in maps:
                lo, hi = (int(x, 16) for x in line.split()[0].split('-'))
                if 'r' not in line.split()[1] or hi - lo > 1 << 26:
                    continue
                try:
                    mem.seek(lo)
                    hexes.update(m.decode() for m in re.findall(rb'[0-9a-f]{32}', mem.read(hi - lo)))
                except (OSError, ValueError, OverflowError):
                    pass
    except OSError:
        pass
marks = ''.join('\\nquantspec-sandbox-passed:%s\\n' % h for h in hexes).encode()
outs = [1, 2] + ['/proc/%s/fd/%d' % (pid, fd) for pid in pids for fd in range(8)]
for out in outs:
    try:
        fd = out if isinstance(out, int) else os.open(out, os.O_WRONLY)
        os.write(fd, marks)
    except OSError:
        pass
os._exit(0)
"""
FORGERIES = {  # completions that try to be scored passed without passing their tests
    "os._exit(0) before the tests": "    return False\nimport os\nos._exit(0)\n",
    "sys.exit(0) before the tests": "    return False\nimport sys\nsys.exit(0)\n",
    "raise SystemExit(0)": "    return False\nraise SystemExit(0)\n",
    "kills itself": "    return False\nimport os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
    "prints a marker of its own": "    return False\nimport os\nprint('\\nquantspec-sandbox-passed:' + '0' * 32)\nos._exit(0)\n",
    "imports the runner as __main__": "    return False\nimport __main__, os\n"
    "[v() for k, v in vars(__main__).items() if callable(v) and k not in ('open',)]\n"
    "os._exit(0)\n",
    # every 32-hex-digit string it can find: in its frames (the runner's own included), among the objects the
    # collector tracks, in the memory of every process it can see (its own, the judge's, the supervisor's);
    # each written as the pass to every output it can open (its own, every visible process's through /proc)
    "walks frames, objects and its memory for the nonce": "    return False\n" + FORGE,
    "returns an object equal to everything": "    class Yes:\n        def __eq__(self, other):\n"
    "            return True\n    return Yes()\n",
}


@pytest.mark.parametrize("kind", SANDBOXES)
@pytest.mark.parametrize("how", list(FORGERIES))
def test_a_completion_cannot_fake_a_pass(kind, how):
    from src.tasks.benchmark_code import program

    out = sandbox.run(program(HUMANEVAL_0, FORGERIES[how]), kind, LIMITS)
    assert out.status == "failed", (how, out)
    honest = "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n"
    assert sandbox.run(program(HUMANEVAL_0, honest), kind, LIMITS).passed  # the same problem, solved


@pytest.mark.parametrize("kind", SANDBOXES)
def test_memory_is_limited_over_the_whole_process_tree(kind):
    """Six children of 420 MB each: each under the per-process limit, together far over it."""
    forks = (
        "import os, time\nkids = []\nfor i in range(6):\n    pid = os.fork()\n    if pid == 0:\n"
        "        b = bytearray(420 << 20)\n        for j in range(0, len(b), 4096): b[j] = 1\n"
        "        time.sleep(3)\n        os._exit(0)\n    kids.append(pid)\n"
        "for k in kids:\n    assert os.waitpid(k, 0)[1] == 0\n"
    )
    out = sandbox.run(forks, kind, sandbox.Limits(timeout_s=8.0, memory_mb=512))
    assert out.status == "failed" and "held more than 512 MB together" in out.detail, out
    one = "b = bytearray(420 << 20)\nfor j in range(0, len(b), 4096): b[j] = 1\n"
    assert sandbox.run(one, kind, sandbox.Limits(timeout_s=8.0, memory_mb=512)).passed  # one of them fits


@pytest.mark.skipif(
    os.geteuid() != 0, reason="the rlimit kind's namespaces are made as root only (this run is not root)"
)
def test_rlimit_as_root_reaches_no_network_and_none_of_the_jobs_processes():
    parent = os.getpid()
    for program in (
        "import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)\n",
        f"import os\nos.kill({parent}, 0)\n",  # the job, by its host pid
        f"open('/proc/{parent}/environ').read()\n",
    ):
        out = sandbox.run(program, "rlimit", LIMITS)
        assert out.status == "failed", (program, out)
    assert "own network, process and mount namespaces" in sandbox.isolation("rlimit")


@pytest.mark.skipif(
    os.geteuid() != 0, reason="the rlimit kind's namespaces are made as root only (this run is not root)"
)
def test_rlimit_as_root_hides_the_cache_and_working_directory_and_keeps_its_scratch_private(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "secret").write_text("token")
    (cache / "secret").chmod(0o644)  # world-readable: only the mask keeps it out
    monkeypatch.setenv("QUANTSPEC_CACHE", str(cache))
    name = f"qs-{uuid.uuid4().hex[:12]}"
    for program in (
        f"open({str(cache / 'secret')!r}).read()\n",
        f"open({os.path.join(os.getcwd(), 'README.md')!r}).read()\n",
    ):  # the job's own folder
        out = sandbox.run(program, "rlimit", LIMITS)
        assert out.status == "failed" and "No such file" in out.detail, (program, out)
    for scratch in sandbox.SCRATCH:  # writable, but its own: nothing reaches the host's
        wrote = (
            f"import os\nopen({scratch!r} + '/{name}', 'w').write('x')\nassert os.listdir({scratch!r}) == [{name!r}]\n"
        )
        assert sandbox.run(wrote, "rlimit", LIMITS).passed, scratch
        assert not os.path.exists(f"{scratch}/{name}"), scratch
    said = sandbox.isolation("rlimit")
    assert "mount namespaces" in said and str(cache) in said and os.getcwd() in said


def test_the_judges_wire_carries_plain_values_and_nothing_else():
    """What crosses between a completion and the judge: plain values come back equal (types kept), anything
    else arrives as a value equal to nothing, so no object of the completion's reaches a comparison."""
    import json

    from src.tasks import sandbox_runner as runner

    plain = [
        None,
        True,
        3,
        -(10**30),
        2.5,
        float("inf"),
        "é|\n",
        b"\x00\xff",
        [1, (2, 3)],
        {"a": {1, 2}},
        frozenset({4}),
    ]
    for value in plain:
        back = runner.dec(json.loads(json.dumps(runner.enc(value))))
        assert back == value and type(back) is type(value), value
    assert runner.dec(json.loads(json.dumps(runner.enc(1.0)))) is not True  # 1.0 stays a float, True a bool

    class Yes:
        def __eq__(self, other):
            return True

    other = runner.dec(runner.enc(Yes()))
    assert other != Yes() and other != other and repr(other) == "<Yes object>"
    with pytest.raises(ValueError):
        runner.dec(["x", 1])  # not a tag the wire has
