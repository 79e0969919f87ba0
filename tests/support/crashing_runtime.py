"""A runtime whose native code dies, as llama.cpp's AMX path did on a Xeon VM: its engine kills its own
process on load or on its first decode (CRASH_AT), by a segfault, an abort or SIGKILL as the kernel's
out-of-memory killer sends it (CRASH_WITH). tests/engine/runtimes/test_runtime_recipe.py runs it in a sweep."""

from __future__ import annotations

import ctypes
import os
import signal

from src.engine.runtimes.isolated import Maker

TITLE = "crashing runtime"


def crash_hint() -> str:
    """Nothing known to do about a crash of its native code on a particular host."""
    return ""


def unsupported(cfg) -> str | None:
    return None


def runtime_name(cfg, device: str) -> str:
    return f"a runtime that crashes ({os.environ.get('CRASH_WITH', 'segv')} on {os.environ.get('CRASH_AT', 'decode')})"


def build(cfg, loaded, placement, corpus, recorder):
    return Maker(
        "tests.support.crashing_runtime:Crashing",
        os.environ.get("CRASH_AT", "decode"),
        os.environ.get("CRASH_WITH", "segv"),
    )


def die(how: str) -> None:
    if how == "segv":
        ctypes.string_at(0)  # a read of address 0: SIGSEGV, as native code's bug is
    os.kill(os.getpid(), signal.SIGABRT if how == "abort" else signal.SIGKILL)


class Crashing:
    def __init__(self, at: str, how: str):
        self.how = how
        if at == "load":
            die(how)

    def __call__(self, model, request):
        input_ids, max_new_tokens, exact, sampling, pad_token_id, stop = request
        die(self.how)


class Echo:
    """An engine that answers with what it was asked (tests/engine/runtimes/test_isolated.py), or refuses to load."""

    def __init__(self, fail: bool = False):
        if fail:
            raise ValueError("no model here")

    def __call__(self, model, request):
        input_ids, max_new_tokens, exact, sampling, pad_token_id, stop = request
        return input_ids, max_new_tokens

    def window_score(self, ids, indices=None):
        return float(ids[0])


class Counting:
    """An engine whose new tokens are 0, 1, 2, ...: it asks the call's stop rule after each, as engines do."""

    def __call__(self, model, request):
        input_ids, max_new_tokens, exact, sampling, pad_token_id, stop = request
        new: list[int] = []
        while len(new) < max_new_tokens and not (new and stop is not None and stop(new)):
            new.append(len(new))
        return new


class Sleeping:
    """An engine that never answers and uses no CPU meanwhile, as a deadlocked runtime does."""

    def __call__(self, model, request):
        input_ids, max_new_tokens, exact, sampling, pad_token_id, stop = request
        import time

        time.sleep(600)
