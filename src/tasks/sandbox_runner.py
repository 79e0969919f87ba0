"""The sandbox's runner (run by src.tasks.sandbox as `python -I -c <this file's text>`, standard library only),
the first code in the sandboxed process: under bwrap it mounts the size-capped /tmp and gives up every
privilege that took; then it sets the limits, reads the job from stdin and runs it.

    argv: memory_bytes  cpu_s  file_bytes  processes  tmpfs_bytes(0: no mount)  setuid|caps
    stdin: <10 digits: length><JSON {"program", ["entry"]}> [<10 digits><JSON {"prompt", "tests"}>] <32-char nonce>

Parts are read exactly (os.read of the bytes announced, never ahead), so a process forked between two parts
holds only what was read before it.

A plain program runs here, as __main__, and passes where it returns: the marker with the run's nonce is
written after it. (Such a program could find the nonce and end early: plain runs are the sandbox's own checks,
never a score.)

A judged program (a completion with tests: "entry" names its function) runs in a child process forked before
this one reads the tests or the nonce, so neither is ever in its memory. This process, made undumpable (no
process of its user can ptrace it or open its /proc files) while the child holds no capability, runs the tests
itself, calling the program's function across a pipe with plain values (None, bools, numbers, strings, bytes
and their lists, tuples, sets and dicts; any other object arrives as a value equal to nothing). The comparisons
happen here, on values the program cannot give an __eq__ of its own, and only this process writes the pass. A
program that exits, stops its child or walks its frames only ends its own process: its tests then fail.
"""

import ctypes
import json
import os
import resource
import sys

NOBODY = 65534
PASSED = b"\nquantspec-sandbox-passed:"
NONCE_CHARS = 32

libc = ctypes.CDLL(None, use_errno=True)


def fail(line: str, code: int = 1) -> None:
    """End here with `line` as the failure's last line of stderr."""
    sys.stderr.write("\n" + line + "\n")
    sys.stderr.flush()
    os._exit(code)


def said(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__


def private_tmp(size: int) -> None:
    if libc.mount(b"tmpfs", b"/tmp", b"tmpfs", 6, b"size=%d,mode=1777" % size) != 0:  # MS_NOSUID | MS_NODEV
        fail(f"sandbox: cannot mount /tmp (errno {ctypes.get_errno()})", 125)
    os.chdir("/tmp")


def no_capabilities(become_nobody: bool) -> None:
    for cap in range(64):  # the bounding set first (it needs CAP_SETPCAP): nothing to regain on exec
        libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP; past the last capability: EINVAL, ignored
    if become_nobody:  # bubblewrap as root: nobody for real, so file permissions apply
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    header, data = (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()
    if libc.prctl(47, 4, 0, 0, 0) != 0 or libc.capset(header, data) != 0:  # ambient, then every other set
        os._exit(125)


def limit(memory: int, cpu: int, fsize: int, nproc: int) -> None:
    for kind, n in (
        (resource.RLIMIT_AS, memory),
        (resource.RLIMIT_CPU, cpu),
        (resource.RLIMIT_FSIZE, fsize),
        (resource.RLIMIT_NPROC, nproc),
    ):
        hard = resource.getrlimit(kind)[1]
        n = n if hard == resource.RLIM_INFINITY else min(n, hard)  # lowered, never raised
        # CPU: SIGXCPU at the limit, SIGKILL a second later (equal limits send SIGKILL first: no verdict)
        roomy = hard == resource.RLIM_INFINITY or n + 1 <= hard
        resource.setrlimit(kind, (n, n + 1 if kind == resource.RLIMIT_CPU and roomy else n))


def exactly(fd: int, n: int) -> bytes:
    got = b""
    while len(got) < n:
        more = os.read(fd, n - len(got))
        if not more:
            os._exit(125)
        got += more
    return got


def part() -> dict:
    return json.loads(exactly(0, int(exactly(0, 10))))


# --- plain values across the pipe ------------------------------------------------------------------------


class Other:
    """A value the wire does not carry: equal to nothing."""

    def __init__(self, name: str):
        self.name = name

    def __eq__(self, other):
        return False

    def __hash__(self):
        return id(self)

    def __repr__(self):
        return f"<{self.name} object>"


TAGS = {list: "l", tuple: "t", set: "s", frozenset: "z"}
MAKE = {"l": list, "t": tuple, "s": set, "z": frozenset}


def enc(v, depth: int = 0):
    if depth > 100:
        raise ValueError("a value nested over 100 deep")
    t = type(v)
    if v is None or t in (bool, int, str):
        return ["v", v]
    if t is float:
        return ["f", repr(v)]
    if t in TAGS:
        return [TAGS[t], [enc(x, depth + 1) for x in v]]
    if t is dict:
        return ["d", [[enc(k, depth + 1), enc(x, depth + 1)] for k, x in v.items()]]
    if t is bytes:
        return ["b", v.hex()]
    return ["o", t.__name__]


def dec(x):
    tag, v = x
    if tag == "v" and (v is None or type(v) in (bool, int, str)):
        return v
    if tag == "f" and type(v) is str:
        return float(v)
    if tag in MAKE:
        return MAKE[tag](dec(i) for i in v)
    if tag == "d":
        return {dec(k): dec(i) for k, i in v}
    if tag == "b":
        return bytes.fromhex(v)
    if tag == "o":
        return Other(str(v)[:60])
    raise ValueError("not a value")


# --- the two kinds of run ------------------------------------------------------------------------------------


def serve(job: dict, requests: int, replies: int) -> None:
    """The program's process: nothing of the judge's but these two pipes, and no capability (rlimit as root
    where nobody cannot run this Python: root without CAP_SYS_PTRACE cannot reach the undumpable judge)."""
    no_capabilities(False)
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    lo, hi = sorted((requests, replies))
    os.closerange(3, lo)
    os.closerange(lo + 1, hi)
    os.closerange(hi + 1, 1 << 16)
    try:
        space = {"__name__": "__main__"}
        exec(compile(job["program"], "<completion>", "exec"), space)  # noqa: S102 - the sandboxed program
        function, broken = space[job["entry"]], None
    except BaseException as err:  # noqa: BLE001 - every answer then says it
        function, broken = None, said(err)
    out = os.fdopen(replies, "wb", buffering=0)
    for line in os.fdopen(requests, "rb"):
        try:
            answer = ["e", broken] if broken else ["r", enc(function(*[dec(a) for a in json.loads(line)]))]
            reply = json.dumps(answer)
        except BaseException as err:  # noqa: BLE001 - the program's own error, as its answer
            reply = json.dumps(["e", said(err)])
        out.write(reply.encode() + b"\n")
    os._exit(0)


class Failed(Exception):
    """The program's function raised: its error, as the test's failure."""


def judge(job: dict) -> bytes:
    """Fork the program's process, then read the tests and the nonce, and run the tests against it."""
    requests_r, requests = os.pipe()
    replies, replies_w = os.pipe()
    child = os.fork()
    if child == 0:
        serve(job, requests_r, replies_w)
    os.close(requests_r)
    os.close(replies_w)
    answers = os.fdopen(replies, "rb")
    checks = part()  # read only now: never in the program's memory
    nonce = exactly(0, NONCE_CHARS)

    def ended() -> int:
        os.kill(child, 9)
        return os.waitpid(child, 0)[1]

    def candidate(*args):
        try:
            os.write(requests, json.dumps([enc(a) for a in args]).encode() + b"\n")
        except BrokenPipeError:
            pass
        line = answers.readline()
        if not line:
            status = ended()
            if os.WIFSIGNALED(status) and os.WTERMSIG(status) != 9:  # its CPU or file limit: said as such
                fail(f"the program was killed by signal {os.WTERMSIG(status)}", 128 + os.WTERMSIG(status))
            fail("the program ended before its tests finished")
        try:
            tag, value = json.loads(line)
            answer = dec(value) if tag == "r" else str(value)
        except Exception:  # noqa: BLE001 - whatever it wrote, it is not an answer
            fail("the program answered with something that is not a value")
        if tag != "r":
            raise Failed(answer)
        return answer

    space = {"__name__": "quantspec_checks"}
    try:  # the prompt's helpers, which tests may call (a prompt that is only a header gets a body)
        helpers = compile(checks["prompt"], "<prompt>", "exec")
    except SyntaxError:
        helpers = compile(checks["prompt"].rstrip() + "\n    pass\n", "<prompt>", "exec")
    try:
        exec(helpers, space)  # noqa: S102 - the problem's own code, trusted
        space[job["entry"]] = candidate  # tests that name the function itself (HumanEval/33) call the program's
        exec(compile(checks["tests"], "<tests>", "exec"), space)  # noqa: S102 - the problem's tests
        space["check"](candidate)
    except Failed as err:
        fail(str(err))
    except BaseException as err:  # noqa: BLE001 - a failed assertion, or the tests' own error
        fail(said(err))
    ended()
    return nonce


def plain(job: dict) -> bytes:
    nonce = exactly(0, NONCE_CHARS)
    sys.stdin = open("/dev/null")  # noqa: SIM115 - for the program's whole run
    try:
        exec(compile(job["program"], "<program>", "exec"), {"__name__": "__main__"})  # noqa: S102
    except BaseException as err:  # noqa: BLE001 - the program's failure, as its last line
        fail(said(err))
    return nonce


def main(argv: list[str]) -> None:
    memory, cpu, fsize, nproc, tmpfs = (int(a) for a in argv[:5])
    if tmpfs:
        private_tmp(tmpfs)
        no_capabilities(argv[5] == "setuid")
    limit(memory, cpu, fsize, nproc)
    libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: the program's process cannot read or trace this one
    job = part()
    nonce = judge(job) if "entry" in job else plain(job)
    sys.stdout.flush()
    os.write(1, PASSED + nonce + b"\n")
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
