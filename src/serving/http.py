"""An OpenAI-compatible HTTP server over continuous batching (src.engine.batching): POST /v1/completions and
/v1/chat/completions (streamed as server-sent events with "stream": true), GET /v1/models and /health.

Python's own ThreadingHTTPServer, a thread per connection: each request is read and tokenized on its thread,
joins the batching loop's queue (at most `max_waiting` wait, those being tokenized counted; past that it is
answered 503 at once), and its tokens come back through a queue of its own. What one request brings cannot fail
another: every field is checked before it joins, and a step that raises is run again row by row so that only
the sequence whose input raised ends (src.engine.batching).

What a client can hold is bounded: at most `max_connections` connections are open (past that, 503 and the
connection closed); a request's headers and body must arrive within `read_timeout_s` (else 408 and closed, a
request trickled a byte at a time included), and an idle keep-alive connection is closed after as long; a
client that goes away, streamed or not, has its sequence cancelled at the next step. Every request gets a
status line and one line of JSON (`{"error": {"message": ...}}`) when it cannot be served, logged at warning.

Why threads and not an asyncio server: the work is the batching loop's, on its own thread; a handler only reads,
tokenizes and waits on its queue, so a thread each costs little once their count and their reading time are
bounded, and the stdlib server keeps the whole path readable here. Loopback by default: nothing here
authenticates a caller.
"""

from __future__ import annotations

import json
import logging
import queue
import select
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from src.common.say import message_line
from src.data import prompts
from src.engine import batching
from src.engine.prefix_cache import PrefixCache
from src.serving import openai
from src.serving.text import Detokenizer

log = logging.getLogger("quantspec.serve")

MAX_BODY = 4 << 20  # bytes: a request's JSON (a 128k-token prompt is ~1 MB of text)
TOKEN_WAIT_S = 600.0  # a request waits this long for its next token before it gives up (a stuck step)
POLL_S = 0.5  # while it waits, a request looks this often whether its client is still there
TOKENIZING = 2  # requests tokenized at once (each may hold a prompt's worth of memory): the cores a host has


class ClientGone(Exception):
    """The client closed its connection while its request was decoding."""


@dataclass(frozen=True)
class Settings:
    """How the server batches, queues and bounds its clients (task=serve's fields of the same names)."""

    max_sequences: int = batching.MAX_SEQUENCES
    max_batch_tokens: int = 32
    max_waiting: int = 64
    default_max_tokens: int = 256
    max_connections: int = 256
    read_timeout_s: float = 30.0
    prefix_cache_mb: int = 512  # finished sequences' keys and values kept for prompts that begin as theirs (0: off)

    @classmethod
    def of(cls, task) -> Settings:
        """The settings of a task=serve config (src.tasks.kinds.Serve)."""
        return cls(
            task.max_sequences, task.max_batch_tokens, task.max_waiting, task.default_max_tokens,
            task.max_connections, task.read_timeout_s, task.prefix_cache_mb,
        )  # fmt: skip


class App:
    """What the handlers share: the model's name and tokenizer, its context, and the batching loop."""

    def __init__(self, model, tokenizer, name: str, max_context: int, settings: Settings):
        step = batching.BatchStep(model)  # Unbatchable, one line, before anything listens
        self.prefixes = PrefixCache(settings.prefix_cache_mb << 20) if settings.prefix_cache_mb > 0 else None
        scheduler = batching.Scheduler(step, settings.max_sequences, settings.max_batch_tokens, self.prefixes)
        self.loop = batching.Loop(scheduler, settings.max_waiting)
        self.tokenizer, self.name, self.max_context = tokenizer, name, max_context
        self.created = int(time.time())  # /v1/models' "created": when this server loaded its model
        self.settings = settings
        self.limits = openai.Limits(max_context, settings.default_max_tokens, (name,))
        self.tokenizing = threading.BoundedSemaphore(TOKENIZING)
        prompts.longest_token(tokenizer)  # once, before the first request waits on it
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

    def setup(self):
        self.timeout = self.server.app.settings.read_timeout_s  # each read and write on the socket
        super().setup()

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        log.debug("%s - %s", self.address_string(), format % args)

    def handle_one_request(self):
        """One request, its reading bounded by read_timeout_s: the server's watch closes a connection whose
        request has not fully arrived by then (408 where part of it came), however slowly its bytes trickle."""
        watch = self.server.watch
        watch(self.connection, partial=False)
        try:
            if not self.rfile.peek(1):  # the client closed its connection between requests
                self.close_connection = True
                return
        except (TimeoutError, OSError):
            self.close_connection = True
            return
        watch(self.connection, partial=True)
        try:
            super().handle_one_request()
        except (TimeoutError, OSError):  # the watch cut it off, or the client reset it
            self.close_connection = True
        finally:
            self.server.unwatch(self.connection)

    def send_error(self, code, message=None, explain=None):
        """The base class's errors (a malformed request line, a method that is not GET or POST, headers too
        long) in the API's shape: the status and one line of JSON."""
        text = message or self.responses.get(code, ("error",))[0]
        log.warning("HTTP %d: %s", code, text)
        self.close_connection = True
        # an unreadable request line leaves the version at HTTP/0.9, whose replies have no status line: give one
        self.request_version = "HTTP/1.1"
        body = json.dumps(openai.error(f"{text}; send an HTTP/1.1 GET or POST as OpenAI's API takes", code)).encode()
        try:
            self.send_response(code, message)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
        except OSError:  # the client is gone already
            pass

    def do_GET(self):
        app = self.server.app
        self.server.unwatch(self.connection)
        if self.path.rstrip("/") in ("/v1/models", "/models"):
            self._json(
                200,
                {
                    "object": "list",
                    "data": [
                        {
                            "id": app.name,
                            "object": "model",
                            "created": app.created,
                            "owned_by": "quantspec",
                            "max_model_len": app.max_context,
                        }
                    ],
                },
            )
        elif self.path.rstrip("/") in ("/health", ""):
            loop = app.loop
            health = {"status": "ok", "running": loop.running(), "waiting": loop.waiting()}
            health.update(cancelled=loop.scheduler.cancelled, connections=self.server.open)
            if app.prefixes is not None:
                kept = app.prefixes
                health["prefix_cache"] = {
                    "entries": len(kept), "mb": round(kept.held / 2**20, 1), "prompt_tokens": kept.stats.prompt_tokens,
                    "hit_tokens": kept.stats.hit_tokens, "hits": kept.stats.hits, "lookups": kept.stats.lookups,
                }  # fmt: skip
            self._json(200, health)
        else:
            self._fail(404, f"no such path {self.path}; the API is at /v1/completions and /v1/chat/completions")

    def do_POST(self):
        self.answered = False  # whether a status line has gone out (a stream's 200)
        try:
            self._post()
        except (BrokenPipeError, ConnectionResetError, TimeoutError, ClientGone):  # the client left
            self.close_connection = True
        except Exception as e:  # noqa: BLE001 - a fault of the server's own: this request's 500, never silence
            line = message_line(e)
            log.warning("a request failed: %s: %s", type(e).__name__, line, exc_info=log.isEnabledFor(logging.DEBUG))
            self.close_connection = True
            if not self.answered:
                try:
                    self._fail(500, f"the server could not answer this request ({type(e).__name__}: {line})")
                except OSError:
                    pass

    def _post(self):
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
        self.server.unwatch(self.connection)
        if len(body) < length:  # cut off by the watch (it answered 408) or by the client
            self.close_connection = True
            return
        try:
            app.loop.reserve()
        except batching.QueueFull as e:
            return self._fail(503, f"the server is busy: {e}; retry later")
        try:
            with app.tokenizing:
                request = openai.read(body, path.endswith("chat/completions"), app.tokenizer, app.limits)
        except openai.BadRequest as e:
            app.loop.release()
            return self._fail(e.status, str(e), e.code, e.param)
        except BaseException:
            app.loop.release()
            raise
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
        finally:
            seq.cancelled = True  # whatever ended this request, its sequence leaves at the next step

    def _gone(self) -> bool:
        """Whether the client has closed its side (a read would return nothing), without reading its data."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if not readable:
                return False
            return self.connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    def _tokens(self, request: openai.Completion, seq: batching.Sequence, events: queue.Queue):
        """(text piece, finish reason or None) as the tokens come; a stop string ends the sequence."""
        text = Detokenizer(self.server.app.tokenizer, request.stop)
        waited = 0.0
        while True:
            try:
                token, done = events.get(timeout=POLL_S)
            except queue.Empty:
                waited += POLL_S
                if self._gone():
                    raise ClientGone from None
                if waited >= TOKEN_WAIT_S:
                    yield text.add(None), f"error: no token came for {TOKEN_WAIT_S:.0f} s"
                    return
                continue
            waited = 0.0
            if self._gone():
                raise ClientGone
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
        """Server-sent events in HTTP/1.1 chunks (a chunk an event, a zero-length one at the end), so the
        connection outlives the stream and a client's next request reuses it, as OpenAI's own does."""
        app = self.server.app
        self.send_response(200)
        self.answered = True
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        first = True
        for piece, finish in self._tokens(request, seq, events):
            if finish is not None and (finish.startswith("error") or finish == "cancelled"):
                self._event(openai.error(f"the request ended: {finish}", 500))
                self._chunk(b"")
                self.close_connection = True  # what the client holds of this stream is not to be trusted on
                app.count(False)
                return
            if piece or finish is not None or first:
                self._event(openai.chunk(request, app.name, piece, finish, first))
                first = False
        if request.include_usage:
            self._event(openai.usage_chunk(request, app.name, len(seq.tokens)))
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")
        app.count(True)

    def _event(self, data: dict) -> None:
        self._chunk(b"data: " + json.dumps(data).encode() + b"\n\n")

    def _chunk(self, data: bytes) -> None:
        """One HTTP/1.1 chunk (its length in hex, the bytes), sent now; b"" ends the body."""
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _json(self, status: int, data: dict) -> None:
        body = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _fail(self, status: int, message: str, code: str | None = None, param: str | None = None) -> None:
        if status != 404 or code is not None:  # a path that is not the API is not a refused request
            self.server.app.count(False)
        # a path that is not the API (a load generator's probe of /metrics) is the caller's business, and a busy
        # server's 503 is its load, not a fault
        level = logging.DEBUG if status == 404 and code is None else logging.INFO if status == 503 else logging.WARNING
        log.log(level, "HTTP %d: %s", status, message)
        self.answered = True
        self._json(status, openai.error(message, status, code, param))

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
    REAP_S = 0.25  # how often the watch looks for requests past their reading time

    def __init__(self, app: App, host: str, port: int):
        super().__init__((host, port), Handler)
        self.app = app
        self.open = 0  # connections being served, a thread each
        self.guard = threading.Lock()
        self.reading: dict[socket.socket, tuple[float, bool]] = {}  # connection: (deadline, part of it came)
        self.stopped = threading.Event()
        threading.Thread(target=self._reap, name="quantspec-http-watch", daemon=True).start()

    def handle_error(self, request, client_address):
        # a client that resets its connection between requests: one line at debug, not socketserver's traceback
        log.debug("connection from %s ended with an error", client_address, exc_info=True)

    def process_request(self, request, client_address):
        """A thread for the connection, or, with max_connections already open, 503 in one line and closed."""
        with self.guard:
            full = self.open >= self.app.settings.max_connections
            if not full:
                self.open += 1
        if not full:
            return super().process_request(request, client_address)
        self.app.count(False)
        log.info("HTTP 503: %d connections are open; refused %s", self.open, client_address[0])
        message = f"the server is busy: it holds {self.app.settings.max_connections} connections already; retry later"
        try:
            request.settimeout(1.0)
            request.sendall(_response(503, "Service Unavailable", openai.error(message, 503)))
        except OSError:
            pass
        self.shutdown_request(request)

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.guard:
                self.open -= 1
                self.reading.pop(request, None)

    def watch(self, conn: socket.socket, partial: bool) -> None:
        """The connection must bring its request within read_timeout_s (partial: some of it has come)."""
        with self.guard:
            self.reading[conn] = (time.monotonic() + self.app.settings.read_timeout_s, partial)

    def unwatch(self, conn: socket.socket) -> None:
        with self.guard:
            self.reading.pop(conn, None)

    def _reap(self) -> None:
        """Close each connection past its reading time: 408 where part of a request came, silently where none."""
        timeout = self.app.settings.read_timeout_s
        while not self.stopped.wait(self.REAP_S):
            now = time.monotonic()
            with self.guard:
                late = [(c, partial) for c, (deadline, partial) in self.reading.items() if deadline < now]
                for conn, _ in late:
                    del self.reading[conn]
            for conn, partial in late:
                if partial:
                    log.warning("HTTP 408: a request did not arrive within %.0f s; closed", timeout)
                    self.app.count(False)
                    message = f"the request did not arrive within {timeout:.0f} s (task.read_timeout_s); send it whole"
                    try:
                        conn.sendall(_response(408, "Request Timeout", openai.error(message, 408)))
                    except OSError:
                        pass
                try:
                    conn.shutdown(socket.SHUT_RDWR)  # the handler's read returns; its thread ends
                except OSError:
                    pass

    @property
    def port(self) -> int:
        return self.server_address[1]

    def url(self) -> str:
        return f"http://{self.server_address[0]}:{self.port}"

    def close(self) -> None:
        """Stop listening, end what is in flight ("cancelled"), and release the port."""
        self.shutdown()
        self.stopped.set()
        self.app.loop.close()
        self.server_close()


def _response(status: int, reason: str, data: dict) -> bytes:
    """A whole HTTP response that closes its connection (written where no handler runs)."""
    body = json.dumps(data).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


def start(app: App, host: str = "127.0.0.1", port: int = 0) -> Server:
    """The server listening on host:port (0: a free port, `server.port` says which), serving on a thread."""
    server = Server(app, host, port)
    threading.Thread(target=server.serve_forever, name="quantspec-http", daemon=True).start()
    return server
