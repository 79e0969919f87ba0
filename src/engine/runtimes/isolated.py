"""Another runtime's engine in a child process of its own, so that its crash is one failed job.

llama.cpp, OpenVINO and ONNX Runtime GenAI run native code that quantspec does not control: a segfault,
an abort or the kernel's out-of-memory kill in one of them would end the sweep's process and every job
after it. `Isolated(maker, name)` starts `python -m src.engine.runtimes.isolated`, builds the engine there
(`Maker("src.engine.runtimes.llamacpp.runtime:LlamaCpp", path, eos, threads)`: that class called with those arguments, which
is where the runtime loads its model), and forwards every call to it: `engine(model, input_ids, ...)` and,
where the child's engine has it, `window_score(ids, indices)`. Each token's timestamp is taken in the child with
`time.perf_counter` (CLOCK_MONOTONIC: one clock for every process of the host), so timings mean what they
mean in process. A call's arguments and answer cross a pipe as JSON and raw tensor bytes (src.engine.runtimes.wire;
the torch model argument is not sent: another runtime holds weights of its own). A call's stop rule (a
tokenizer's, a task's) stays in this process: the child asks it after each new token, and waits for the
answer, as the rule's own call would take its time in process.

A child that dies is said in one line, by what killed it and when (`llama.cpp crashed (SIGSEGV) on its
first decode`), as the RuntimeError its job fails with; a Python error in the child is its first line. One
that lives but does not work (stopped, or using no CPU for minutes: src.common.liveness) is ended and said
the same way.
The child dies with its parent (PR_SET_PDEATHSIG) and is ended when the engine is closed or collected.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import signal
import subprocess
import sys
import traceback
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection

from src.common import liveness
from src.common.environment import PROJECT_ROOT
from src.engine.generation import Request, ScoringEngine
from src.engine.runtimes import wire

ROOT = PROJECT_ROOT
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


class Maker:
    """What the runtime's process calls to make the engine: `target` ("package.module:Name") with these
    arguments, which must be values src.engine.runtimes.wire carries (a folder, numbers, a tuple of token ids): a
    maker holding anything else is a TypeError here, where it is made, not in the child."""

    def __init__(self, target: str, *args, **kwargs):
        module, sep, name = target.partition(":")
        if not (sep and module and name):
            raise ValueError(f"Maker({target!r}): name what makes the engine as 'package.module:Name'")
        wire.check((args, kwargs))
        self.target, self.module, self.name, self.args, self.kwargs = target, module, name, args, kwargs

    def __repr__(self) -> str:
        return f"Maker({self.target!r}, ...)"

    def __call__(self):
        return getattr(importlib.import_module(self.module), self.name)(*self.args, **self.kwargs)


def no_crash_hint() -> str:
    """A runtime's crash_hint where nothing is known to do about a crash on a particular host."""
    return ""


class Isolated:
    """The engine `make()` builds, run in a child process; called as every engine is."""

    def __init__(self, make: Maker, name: str, hint: Callable[[], str] = lambda: ""):
        """`hint()`: what to do about a crash on this host (asked only when one happens)."""
        self.name, self.hint, self.calls = name, hint, 0
        child_reads, parent_writes = os.pipe()
        parent_reads, child_writes = os.pipe()
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.getcwd(), os.environ.get("PYTHONPATH", "")) if p),
        }
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "src.engine.runtimes.isolated", str(child_reads), str(child_writes)],
            pass_fds=(child_reads, child_writes),
            env=env,
            cwd=os.getcwd(),
        )
        os.close(child_reads)
        os.close(child_writes)
        self._send = Connection(parent_writes, readable=False)
        self._recv = Connection(parent_reads, writable=False)
        self.close = weakref.finalize(self, _end, self._proc, self._send, self._recv)  # once: by hand or when collected
        scores = self._ask("its load", "make", make.target, make.args, make.kwargs)
        # the child's engine's window_score where it has one (a ScoringEngine); None: quality tasks score with
        # torch's forward (src.quality.scoring)
        self.scorer: Callable | None = self.window_score if scores else None

    def __call__(self, model, request: Request):
        self.calls += 1
        when = "its first decode" if self.calls == 1 else f"decode {self.calls}"
        *fields, stop = request  # the stop rule stays here: the child asks it (a function does not cross)
        return self._ask(when, "call", *fields, stop is not None, stop=stop)

    def window_score(self, ids, indices=None):
        return self._ask("a scored window", "window_score", ids, indices)

    def _ask(self, when: str, op: str, *args, stop=None):
        """Send op and wait for its answer, answering the child's questions to the call's `stop` rule meanwhile."""
        self._post(when, (op, args))
        new: list[int] = []  # the call's new tokens as the child has told them
        watch = liveness.Watch(self._proc.pid)
        while True:
            while not self._recv.poll(POLL_S):
                if self._proc.poll() is not None:
                    self._died(when)
                if (problem := watch.problem()) is not None:  # alive but not working: a bound, not forever
                    self._proc.kill()  # SIGKILL ends a stopped process too
                    self.close()
                    raise RuntimeCrash(
                        f"{self.name}'s process {problem} on {when}; ended it: the job is failed, the sweep goes on"
                    )
            try:
                kind, value = wire.receive(self._recv)
            except (EOFError, OSError):
                self._died(when)
            if kind != "stop?":
                break
            keep, more = value  # the new tokens so far: the first `keep` as last asked, then `more`
            new[keep:] = more
            try:  # the call's stop rule, asked with the new tokens so far
                verdict = bool(stop(list(new)))
            except BaseException:  # the child waits for an answer it will not get: end it, then say why
                self.close()
                raise
            self._post(when, ("stop", verdict))
        if kind == "error":  # a Python error in the child: its first line, its traceback kept as a note
            line, child_traceback = value
            err = RuntimeError(f"{self.name} failed on {when}: {line}")
            err.add_note(f"in the runtime's process:\n{child_traceback}")
            raise err
        return value

    def _post(self, when: str, message) -> None:
        try:
            wire.send(self._send, message)
        except (BrokenPipeError, OSError):
            self._died(when)

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
            wire.send(send, ("exit", ()))
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
    engine = None

    told: list[int] = []  # the new tokens the parent has been sent in this call

    def stop(new: list[int]) -> bool:  # the parent's stop rule, asked across the pipe
        keep = len(told) if new[: len(told)] == told else 0  # only what the parent has not seen
        wire.send(send, ("stop?", (keep, list(new[keep:]))))
        told[:] = new
        op, verdict = wire.receive(recv)
        if op != "stop":  # the parent ended this process instead (its stop rule failed)
            os._exit(0)
        return verdict

    while True:
        try:
            op, args = wire.receive(recv)
        except EOFError:
            return
        if op == "exit":
            return
        try:
            if op == "make":
                engine = Maker(args[0], *args[1], **args[2])()
                value = isinstance(engine, ScoringEngine)
            elif op == "call":
                *call, has_stop = args
                told.clear()
                value = engine(None, Request(*call, stop=stop if has_stop else None))
            else:
                value = engine.window_score(*args)
            answer = ("ok", value)
        except Exception as err:  # noqa: BLE001 - sent to the parent as the job's one-line failure
            text = str(err).strip()
            answer = (
                "error",
                (f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"[:300], traceback.format_exc()),
            )
        try:
            wire.send(send, answer)
        except TypeError as err:  # an answer that cannot cross (checked before anything was written)
            wire.send(send, ("error", (f"TypeError: {err}"[:300], traceback.format_exc())))


if __name__ == "__main__":
    _die_with_parent()
    sys.path.insert(0, str(ROOT))
    serve(Connection(int(sys.argv[1]), writable=False), Connection(int(sys.argv[2]), readable=False))
