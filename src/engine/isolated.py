"""Another runtime's engine in a child process of its own, so that its crash is one failed job.

llama.cpp, OpenVINO and ONNX Runtime GenAI run native code that quantspec does not control: a segfault,
an abort or the kernel's out-of-memory kill in one of them would end the sweep's process and every job
after it. `Isolated(make, name)` starts `python -m src.engine.isolated`, builds the engine there
(`make()`: a picklable zero-argument callable, such as `functools.partial(Engine, folder, ...)`, which is
where the runtime loads its model), and forwards every call to it: `engine(model, input_ids, ...)` and,
where the child's engine has it, `window_score(ids, indices)`. Each token's timestamp is taken in the child with
`time.perf_counter` (CLOCK_MONOTONIC: one clock for every process of the host), so timings mean what they
mean in process. A call's arguments and answer cross a pipe (the torch model argument is not sent:
another runtime holds weights of its own); the stop rule of a call is sent once and reused.

A child that dies is said in one line, by what killed it and when (`llama.cpp crashed (SIGSEGV) on its
first decode`), as the RuntimeError its job fails with; a Python error in the child is its first line.
The child dies with its parent (PR_SET_PDEATHSIG) and is ended when the engine is closed or collected.
"""

from __future__ import annotations

import ctypes
import os

# Messages between this process and the runtime's process it started: both run this code, nothing is read
# from disk or from anyone else, and a call's stop rule (a tokenizer's) and the engine's maker are Python
# objects with no plainer form. Caches stay safetensors + JSON.
import pickle
import signal
import subprocess
import sys
import traceback
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
POLL_S = 0.2  # how often a waiting parent checks that its child still lives


class RuntimeCrash(RuntimeError):
    """The runtime's process died; the message is the one line the job fails with."""


def death(returncode: int) -> str:
    """What ended a child: `SIGSEGV`, `SIGKILL: out of memory, or killed by hand`, `exit status 3`."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"{name}: out of memory, or killed by hand" if name == "SIGKILL" else name
    return f"exit status {returncode}"


class Isolated:
    """The engine `make()` builds, run in a child process; called as every engine is."""

    def __init__(self, make: Callable[[], Callable], name: str, hint: Callable[[], str] = lambda: ""):
        """`hint()`: what to do about a crash on this host (asked only when one happens)."""
        self.name, self.hint, self.calls = name, hint, 0
        child_reads, parent_writes = os.pipe()
        parent_reads, child_writes = os.pipe()
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.getcwd(), os.environ.get("PYTHONPATH", "")) if p),
        }
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "src.engine.isolated", str(child_reads), str(child_writes)],
            pass_fds=(child_reads, child_writes),
            env=env,
            cwd=os.getcwd(),
        )
        os.close(child_reads)
        os.close(child_writes)
        self._send = Connection(parent_writes, readable=False)
        self._recv = Connection(parent_reads, writable=False)
        self._stop_sent: object = None
        self.close = weakref.finalize(self, _end, self._proc, self._send, self._recv)  # once: by hand or when collected
        has_window_score = self._ask("its load", "make", make)
        if not has_window_score:
            self.window_score = None  # quality tasks then score with torch's forward (src.quality.scoring)

    def __call__(self, model, input_ids, max_new_tokens: int, exact: bool, sampling, pad_token_id, stop=None):
        self.calls += 1
        if stop is not self._stop_sent:  # one stop rule serves a task's every call: sent once
            self._ask("its stop rule", "stop", stop)
            self._stop_sent = stop
        when = "its first decode" if self.calls == 1 else f"decode {self.calls}"
        return self._ask(when, "call", input_ids, max_new_tokens, exact, sampling, pad_token_id)

    def window_score(self, ids, indices=None):
        return self._ask("a scored window", "window_score", ids, indices)

    def _ask(self, when: str, op: str, *args):
        try:
            self._send.send_bytes(pickle.dumps((op, args)))
        except (BrokenPipeError, OSError):
            self._died(when)
        while not self._recv.poll(POLL_S):
            if self._proc.poll() is not None:
                self._died(when)
        try:
            kind, value = pickle.loads(self._recv.recv_bytes())
        except (EOFError, OSError):
            self._died(when)
        if kind == "error":  # a Python error in the child: its first line, its traceback kept as a note
            line, child_traceback = value
            err = RuntimeError(f"{self.name} failed on {when}: {line}")
            err.add_note(f"in the runtime's process:\n{child_traceback}")
            raise err
        return value

    def _died(self, when: str):
        try:
            code = self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # its pipe closed but it lives: end it, said as what it was
            self._proc.kill()
            code = self._proc.wait()
        hint = self.hint()
        raise RuntimeCrash(
            f"{self.name} crashed ({death(code)}) on {when}; the job is failed, the sweep goes on"
            + (f" ({hint})" if hint else "")
        ) from None


def _end(proc: subprocess.Popen, send: Connection, recv: Connection) -> None:
    if proc.poll() is None:
        try:
            send.send_bytes(pickle.dumps(("exit", ())))
            proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
    for conn in (send, recv):
        conn.close()


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the parent dies, so a killed sweep leaves no runtime behind."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)


def serve(recv: Connection, send: Connection) -> None:
    """The child's loop: build the engine, then answer each call until told to exit."""
    engine, stop = None, None
    while True:
        try:
            op, args = pickle.loads(recv.recv_bytes())
        except EOFError:
            return
        if op == "exit":
            return
        try:
            if op == "make":
                engine = args[0]()
                value = callable(getattr(engine, "window_score", None))
            elif op == "stop":
                stop, value = args[0], None
            elif op == "call":
                value = engine(None, *args, stop=stop)
            else:
                value = engine.window_score(*args)
            answer = ("ok", value)
        except Exception as err:  # noqa: BLE001 - sent to the parent as the job's one-line failure
            text = str(err).strip()
            answer = (
                "error",
                (f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"[:300], traceback.format_exc()),
            )
        send.send_bytes(pickle.dumps(answer))


if __name__ == "__main__":
    _die_with_parent()
    sys.path.insert(0, str(ROOT))
    serve(Connection(int(sys.argv[1]), writable=False), Connection(int(sys.argv[2]), readable=False))
