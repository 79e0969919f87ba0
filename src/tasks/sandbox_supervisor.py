"""The sandbox's supervisor (trusted code, run by src.tasks.sandbox as `python -I -c <this file's text>`, with
the standard library only): a subreaper that runs the program, ends it at the time limit, when more processes
than its limit are below it, or when their resident memory together passes its budget, then stops and kills
every process left below it (a fork bomb cannot outrun a stopped tree).

    argv: timeout_s  drop(0|1)  processes  memory_bytes  masks  command...

`drop`: run the command as nobody (rlimit as root). `masks`: lines `w:<folder>` (a private, size-capped tmpfs
over a scratch folder shared with other users) and `h:<folder>` (an empty read-only tmpfs over a folder to
hide), mounted first, in the mount namespace it was started in. Exits with the program's status, 128 + a
signal that ended it, or one of the codes below.
"""

import ctypes
import os
import signal
import subprocess
import sys
import time

NOBODY = 65534
TMPFS_BYTES = 16 << 20  # a scratch folder's tmpfs (bwrap's /tmp, the runner's, is the same size)
TIMED_OUT = 124  # the wall-clock limit
TOO_MANY = 123  # more processes than the limit below it
TOO_BIG = 122  # its processes together held more resident memory than the budget
TICK_S = 0.02  # how often the limits are looked at


def mask(masks: list[tuple[str, str]]) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    for how, path in masks:
        if not os.path.isdir(path):  # gone, or hidden by an earlier mask
            continue
        flags, options = (6, b"size=%d,mode=1777" % TMPFS_BYTES) if how == "w" else (7, b"size=4k,mode=0755")
        if libc.mount(b"tmpfs", path.encode(), b"tmpfs", flags, options) != 0:  # MS_NOSUID | MS_NODEV (| MS_RDONLY)
            sys.stderr.write(f"sandbox: cannot mask {path} (errno {ctypes.get_errno()})\n")
            sys.exit(125)


def resident(pids: list[int], page: int) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * page
        except (OSError, IndexError, ValueError):
            pass
    return total


def below(pid: int) -> list[int]:
    """Every process below `pid`, through each thread's children."""
    found = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found += [int(p) for p in f.read().split()]
    except OSError:
        pass
    return found + [q for p in found for q in below(p)]


def state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(") ")[2][:1]
    except OSError:
        return "X"


def kill(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def watch(child: subprocess.Popen, timeout_s: float, limit: int, budget: int) -> int:
    """The time limit, and a process count kept here as well as by RLIMIT_NPROC (which exempts root: a program
    that could not become nobody), and the memory of all its processes together."""
    page = os.sysconf("SC_PAGE_SIZE")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            code = child.wait(timeout=TICK_S)
            return 128 - code if code < 0 else code
        except subprocess.TimeoutExpired:
            tree = below(os.getpid())
            if time.monotonic() > deadline:
                return TIMED_OUT
            if len(tree) > limit:
                return TOO_MANY
            if resident(tree, page) > budget:  # RLIMIT_AS holds each process; this, all of them together
                return TOO_BIG


def end(child: subprocess.Popen) -> None:
    """Stop the whole tree (stopped processes cannot fork) until nothing in it runs, then kill it all."""
    try:
        os.killpg(child.pid, signal.SIGSTOP)
    except OSError:
        pass
    for _ in range(1000):
        running = [p for p in below(os.getpid()) if state(p) not in "TtZX"]
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


def main(argv: list[str]) -> int:
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: every orphan below becomes ours
    timeout_s, drop, limit, budget = float(argv[0]), argv[1] == "1", int(argv[2]), int(argv[3])
    masks = [tuple(line.split(":", 1)) for line in argv[4].splitlines()]
    if masks:
        mask(masks)
    ids = {"user": NOBODY, "group": NOBODY, "extra_groups": []} if drop else {}
    # its own process group, stopped in one call
    child = subprocess.Popen(argv[5:], start_new_session=True, cwd="/tmp" if masks else None, **ids)
    code = watch(child, timeout_s, limit, budget)
    end(child)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
