"""An OpenAI-compatible HTTP server over continuous batching (src.engine.batching): POST /v1/completions and
/v1/chat/completions (streamed as server-sent events with "stream": true), GET /v1/models and /health.

Python's own ThreadingHTTPServer, a thread per connection: each request is read and tokenized on its thread,
joins the batching loop's queue (at most `max_waiting` wait; past that it is answered 503 at once), and its
tokens come back through a queue of its own. A request that cannot be served gets its HTTP status and one line
(`{"error": {"message": ...}}`); a client that goes away mid-stream has its sequence cancelled at the next step;
neither touches any other request. Loopback by default: nothing here authenticates a caller.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from src.engine import batching
from src.serving import openai
from src.serving.text import Detokenizer

log = logging.getLogger("quantspec.serve")

MAX_BODY = 4 << 20  # bytes: a request's JSON (a 128k-token prompt is ~1 MB of text)
TOKEN_WAIT_S = 600.0  # a request waits this long for its next token before it gives up (a stuck step)


@dataclass
class Settings:
    """How the server batches and queues (task=serve's fields of the same names)."""

    max_sequences: int = batching.MAX_SEQUENCES
    max_batch_tokens: int = 32
    max_waiting: int = 64


class App:
    """What the handlers share: the model's name and tokenizer, its context, and the batching loop."""

    def __init__(self, model, tokenizer, name: str, max_context: int, settings: Settings):
        step = batching.BatchStep(model)  # Unbatchable, one line, before anything listens
        scheduler = batching.Scheduler(step, settings.max_sequences, settings.max_batch_tokens)
        self.loop = batching.Loop(scheduler, settings.max_waiting)
        self.tokenizer, self.name, self.max_context = tokenizer, name, max_context
        self.served = self.refused = 0  # requests answered in full; refused with an error status
        self.counter = threading.Lock()

    def count(self, served: bool) -> None:
        with self.counter:
            if served:
                self.served += 1
            else:
                self.refused += 1


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # each streamed token is a small write: with Nagle's algorithm on, one waits for the client's (delayed) ACK
    # of the one before (measured: a token every 22 ms where the step takes 12)
    disable_nagle_algorithm = True
    server: Server

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        log.debug("%s - %s", self.address_string(), format % args)

    def do_GET(self):
        app = self.server.app
        if self.path.rstrip("/") in ("/v1/models", "/models"):
            self._json(
                200,
                {
                    "object": "list",
                    "data": [
                        {"id": app.name, "object": "model", "owned_by": "quantspec", "max_model_len": app.max_context}
                    ],
                },
            )
        elif self.path.rstrip("/") in ("/health", ""):
            self._json(200, {"status": "ok", "running": app.loop.running(), "waiting": app.loop.waiting()})
        else:
            self._fail(404, f"no such path {self.path}; the API is at /v1/completions and /v1/chat/completions")

    def do_POST(self):
        app = self.server.app
        path = self.path.split("?")[0].rstrip("/")
        if path not in ("/v1/completions", "/v1/chat/completions"):
            self._drain()
            return self._fail(404, f"no such path {self.path}; POST to /v1/completions or /v1/chat/completions")
        length = self._length()
        if length < 0 or length > MAX_BODY:
            self.close_connection = True
            return self._fail(413, f"the body must have a Content-Length of at most {MAX_BODY} bytes")
        body = self.rfile.read(length)
        try:
            request = openai.read(body, path.endswith("chat/completions"), app.tokenizer, app.max_context)
        except openai.BadRequest as e:
            return self._fail(e.status, str(e))
        events: queue.Queue = queue.Queue()
        seq = batching.Sequence(
            request.prompt_ids,
            request.max_tokens,
            lambda token, done: events.put((token, done)),
            sampling=request.sampling,
            ignore_eos=request.ignore_eos,
        )
        try:
            app.loop.submit(seq)
        except batching.QueueFull as e:
            return self._fail(503, f"the server is busy: {e}; retry later")
        try:
            (self._stream if request.stream else self._whole)(request, seq, events)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):  # the client left: its sequence ends
            seq.cancelled = True
            self.close_connection = True

    def _tokens(self, request: openai.Completion, seq: batching.Sequence, events: queue.Queue):
        """(text piece, finish reason or None) as the tokens come; a stop string ends the sequence."""
        text = Detokenizer(self.server.app.tokenizer, request.stop)
        while True:
            try:
                token, done = events.get(timeout=TOKEN_WAIT_S)
            except queue.Empty:
                seq.cancelled = True
                yield text.add(None), f"error: no token came for {TOKEN_WAIT_S:.0f} s"
                return
            piece = text.add(token)
            if text.stopped:
                seq.cancelled = True
                yield piece, "stop"
                return
            if done is not None:
                yield piece + text.add(None), done
                return
            yield piece, None

    def _whole(self, request, seq, events):
        pieces, finish = [], "error: no answer"
        for piece, end in self._tokens(request, seq, events):
            pieces.append(piece)
            finish = end or finish
        if finish.startswith("error") or finish == "cancelled":
            self.server.app.count(False)
            return self._fail(500 if finish.startswith("error") else 503, f"the request ended: {finish}")
        self._json(200, openai.whole(request, self.server.app.name, "".join(pieces), finish, len(seq.tokens)))
        self.server.app.count(True)

    def _stream(self, request, seq, events):
        app = self.server.app
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")  # the stream's end is the connection's
        self.end_headers()
        self.close_connection = True
        first = True
        for piece, finish in self._tokens(request, seq, events):
            if finish is not None and (finish.startswith("error") or finish == "cancelled"):
                self._event({"error": {"message": f"the request ended: {finish}", "type": "server_error"}})
                app.count(False)
                return
            if piece or finish is not None or first:
                self._event(openai.chunk(request, app.name, piece, finish, first))
                first = False
        if request.include_usage:
            self._event(openai.usage_chunk(request, app.name, len(seq.tokens)))
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        app.count(True)

    def _event(self, data: dict) -> None:
        self.wfile.write(b"data: " + json.dumps(data).encode() + b"\n\n")
        self.wfile.flush()

    def _json(self, status: int, data: dict) -> None:
        body = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _fail(self, status: int, message: str) -> None:
        if status != 404:
            self.server.app.count(False)
        # a path that is not the API (a load generator's probe of /metrics) is the caller's business
        log.log(logging.DEBUG if status == 404 else logging.INFO, "HTTP %d: %s", status, message)
        self._json(status, openai.error(message, status))

    def _length(self) -> int:
        """The body's Content-Length (0 where none is sent; -1 where it is no number)."""
        try:
            return int(self.headers.get("Content-Length") or 0)
        except ValueError:
            return -1

    def _drain(self) -> None:
        length = self._length()
        if 0 < length <= MAX_BODY:
            self.rfile.read(length)


class Server(ThreadingHTTPServer):
    daemon_threads = True  # a connection's thread never holds the process open at its end
    allow_reuse_address = True
    # the listen backlog: socketserver's 5 reset 9 of 100 clients connecting at once (the queue behind it answers
    # them 503 instead, in one line)
    request_queue_size = 1024

    def handle_error(self, request, client_address):
        # a client that resets its connection between requests: one line at debug, not socketserver's traceback
        log.debug("connection from %s ended with an error", client_address, exc_info=True)

    def __init__(self, app: App, host: str, port: int):
        super().__init__((host, port), Handler)
        self.app = app

    @property
    def port(self) -> int:
        return self.server_address[1]

    def url(self) -> str:
        return f"http://{self.server_address[0]}:{self.port}"

    def close(self) -> None:
        """Stop listening, end what is in flight ("cancelled"), and release the port."""
        self.shutdown()
        self.app.loop.close()
        self.server_close()


def start(app: App, host: str = "127.0.0.1", port: int = 0) -> Server:
    """The server listening on host:port (0: a free port, `server.port` says which), serving on a thread."""
    server = Server(app, host, port)
    threading.Thread(target=server.serve_forever, name="quantspec-http", daemon=True).start()
    return server
