"""Entry point: quantspec's OpenAI-compatible server, on its own.

    python -m src.serve                                  # the default model, fp32, on http://127.0.0.1:8000/v1
    python -m src.serve precision=w4a16 task.port=8080   # any job's overrides: model, precision, hardware, ...
    curl -s localhost:8000/v1/completions -H 'Content-Type: application/json' \\
         -d '{"prompt": "The capital of France is", "max_tokens": 16}'

The model is loaded and quantized as a job of `python -m src.run` would be (the same overrides, the same
caches), then served by src.serving: /v1/completions and /v1/chat/completions, streamed or not, with continuous
batching (task.max_sequences, task.max_batch_tokens, task.max_waiting). It serves until SIGINT or SIGTERM, then
ends what is in flight and exits 0; a command line it cannot serve exits 2 with one line.
"""

from __future__ import annotations

from src.common import startup  # first: the collector paused for the imports below

# isort: split
import logging
import signal
import sys
import threading

from src.assembly.composed import job_config
from src.assembly.job import build
from src.common import envvars
from src.common.envvars import EnvError
from src.common.say import say
from src.common.schema import ConfigError
from src.engine.batching import Unbatchable
from src.serving import http

startup.imported()


def main(argv: list[str]) -> int:
    if "--help" in argv or "-h" in argv:
        print(__doc__.strip())
        return 0
    startup.detach_stdin()  # nothing the server loads reads a question's answer from it
    logging.basicConfig(level=logging.WARNING, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    args = argv if any(a.startswith("task=") for a in argv) else ["task=serve", *argv]
    try:
        envvars.check()
        cfg = job_config(args)
        if cfg.task.kind != "serve":
            raise ConfigError(f"python -m src.serve serves task=serve's settings, not task={cfg.task.name}")
        reason = cfg.unsupported_reason()
        if reason is not None:
            raise ConfigError(reason)
        job = build(cfg)
        t = cfg.task
        settings = http.Settings.of(t)
        app = http.App(job.model, job.loaded.tokenizer, cfg.model.name, job.loaded.max_context, settings)
        server = http.start(app, t.host, t.port)
    except (ConfigError, EnvError, Unbatchable, OSError) as e:
        say(f"cannot serve: {e}", err=True)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    say(f"serving {cfg.model.name} at {cfg.precision.name} on {server.url()}/v1 (OpenAI-compatible; Ctrl-C ends it)")
    while not stop.wait(1.0):
        pass
    server.close()
    say(f"server stopped: {app.served} requests served, {app.refused} refused")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
