"""python -m src.serve as a real process on loopback, under the faults a server meets: a malformed body, a prompt
longer than the context, a client that leaves mid-stream or before its whole answer, 100 requests at once over a
queue of 10, one request whose input would fail a step beside three decoding, requests that arrive a byte at a
time or never, more connections than the server holds. Each is answered (an error in one line where it cannot
be served), no other request is lost, and SIGTERM ends the process cleanly."""

import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from tests.support.cli import ROOT, cli_env

START_S = 180  # the model's build and the kernels' load on a busy host
READ_S = 3  # the server's read timeout here: a request must arrive within it
CONNECTIONS = 40  # the connections it holds


@pytest.fixture(scope="module")
def server():
    proc = subprocess.Popen(
        [sys.executable, "-m", "src.serve", "model=tiny-gemma3", "precision=fp32", "task.port=0",
         "task.max_sequences=4", "task.max_waiting=10", "task.max_batch_tokens=8",
         f"task.read_timeout_s={READ_S}", f"task.max_connections={CONNECTIONS}"],
        cwd=ROOT, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines, url = [], None
    deadline = time.monotonic() + START_S
    while url is None and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        lines.append(line)
        found = re.search(r"on (http://127\.0\.0\.1:\d+)/v1", line)
        url = found.group(1) if found else None
    assert url is not None, "the server never said where it listens:\n" + "".join(lines[-20:])
    yield proc, url
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def post(url, path, body, timeout=120):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def get(url, path):
    with urllib.request.urlopen(url + path, timeout=30) as r:
        return json.loads(r.read())


def idle(url, within=30.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        health = get(url, "/health")
        if health["running"] == 0 and health["waiting"] == 0:
            return True
        time.sleep(0.1)
    return False


def test_a_malformed_body_and_an_overlong_prompt_are_refused_and_the_server_goes_on(server):
    _, url = server
    status, body = post(url, "/v1/completions", b'{"prompt": "hi", ')
    error = json.loads(body)["error"]
    assert status == 400 and "not JSON" in error["message"] and error["code"] is None and "param" in error
    model = get(url, "/v1/models")["data"][0]
    context = model["max_model_len"]
    assert isinstance(model["created"], int) and model["created"] <= time.time()
    status, body = post(url, "/v1/completions", {"prompt": [2] * (context + 1), "max_tokens": 1})
    message = json.loads(body)["error"]["message"]
    assert status == 400 and f"context of {context} tokens" in message and "\n" not in message
    status, body = post(url, "/v1/completions", {"prompt": "hello", "max_tokens": 4, "temperature": 0})
    answer = json.loads(body)
    assert status == 200 and answer["usage"]["completion_tokens"] >= 1 and answer["choices"][0]["finish_reason"]


def test_a_client_that_leaves_mid_stream_frees_its_place(server):
    _, url = server
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"prompt": "once upon a time", "max_tokens": 200, "stream": True, "ignore_eos": True}).encode()
    head = f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(head.encode() + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        got = b""
        while b"data: " not in got:  # the first token streamed
            chunk = sock.recv(4096)
            assert chunk, "the server closed the stream before its first token"
            got += chunk
        assert got.startswith(b"HTTP/1.1 200")
    # gone, mid-stream
    assert idle(url), "the abandoned sequence kept decoding"
    status, _ = post(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
    assert status == 200


def test_a_hundred_requests_over_a_queue_of_ten_are_each_answered(server):
    _, url = server
    statuses, lock = [], threading.Lock()

    def one(i):
        status, body = post(url, "/v1/completions", {"prompt": f"request {i}", "max_tokens": 6, "ignore_eos": True})
        with lock:
            statuses.append((status, body))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(100)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert len(statuses) == 100  # every one answered
    served = [json.loads(b) for s, b in statuses if s == 200]
    busy = [json.loads(b)["error"]["message"] for s, b in statuses if s == 503]
    assert len(served) + len(busy) == 100
    assert all(a["usage"]["completion_tokens"] == 6 for a in served)  # none cut short by the crowd
    assert len(served) >= 14 and busy and all("busy" in m for m in busy)
    assert idle(url)


def raw(url, data: bytes, wait_s: float = 30.0) -> bytes:
    """What the server sends back for `data` written as is, until it closes the connection."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=wait_s) as sock:
        sock.sendall(data)
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
        return got


def status_and_line(reply: bytes) -> tuple[int, str]:
    head, _, body = reply.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1])
    message = json.loads(body)["error"]["message"]
    assert "\n" not in message
    return status, message


def test_one_requests_bad_seed_fails_none_of_the_three_decoding_beside_it(server):
    _, url = server
    results = {}

    def victim(i):
        results[i] = post(url, "/v1/completions", {"prompt": f"victim {i}", "max_tokens": 120, "ignore_eos": True})

    threads = [threading.Thread(target=victim, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while get(url, "/health")["running"] < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    bad = {"prompt": "the fourth", "max_tokens": 4, "temperature": 1.0, "seed": 18446744073709551616}
    status, body = post(url, "/v1/completions", bad)
    for t in threads:
        t.join(120)
    assert status == 400 and "seed" in json.loads(body)["error"]["message"]
    assert [results[i][0] for i in range(3)] == [200, 200, 200]
    assert all(json.loads(results[i][1])["usage"]["completion_tokens"] == 120 for i in range(3))


@pytest.mark.parametrize(
    ("data", "status", "words"),
    [
        (b"GARBAGE\r\n\r\n", 400, "Bad request"),
        (b"PUT /v1/completions HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 501, "Unsupported method"),
        (b"GET /" + b"x" * 70_000 + b" HTTP/1.1\r\n\r\n", 414, "URI Too Long"),
        (b"[" * 100_000, 400, "nests too deeply"),
        (json.dumps({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}).encode(), 400, "text"),
        (json.dumps({"prompt": "hi", "stop": "s" * (1 << 20)}).encode(), 400, "at most 256"),
        (json.dumps({"prompt": "hi", "stop": list("abcde")}).encode(), 400, "at most 4"),
        (json.dumps({"prompt": "x" * 3_000_000}).encode(), 400, "more than the model's context"),
    ],
    ids=["request-line", "method", "long-path", "nested", "text-part", "long-stop", "five-stops", "long-prompt"],
)
def test_every_malformed_request_gets_a_status_line_and_one_line_of_json(server, data, status, words):
    _, url = server
    if not data.startswith((b"GARBAGE", b"PUT", b"GET")):  # a body: POSTed to the chat or completions path
        path = "/v1/chat/completions" if b"messages" in data else "/v1/completions"
        data = f"POST {path} HTTP/1.1\r\nContent-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data
    got, line = status_and_line(raw(url, data))
    assert got == status and words in line


def test_a_request_trickled_a_byte_at_a_time_is_cut_off_with_408_and_an_idle_one_closed(server):
    _, url = server
    host, port = url.removeprefix("http://").split(":")
    begun = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=READ_S * 10) as sock:
        request = b"POST /v1/completions HTTP/1.1\r\nContent-Length: 20\r\n\r\n" + b"{" * 20
        try:
            for byte in request:  # never whole within the read timeout
                sock.sendall(bytes([byte]))
                time.sleep(0.2)
        except OSError:  # the server closed it, as it should
            pass
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
    assert READ_S - 0.5 < time.monotonic() - begun < READ_S * 4
    status, line = status_and_line(got)
    assert status == 408 and "read_timeout_s" in line
    with socket.create_connection((host, int(port)), timeout=READ_S * 10) as idle_one:
        begun = time.monotonic()
        assert idle_one.recv(1) == b""  # closed by the server, with nothing said: no request had begun
    assert time.monotonic() - begun < READ_S * 4


def test_connections_past_the_cap_are_answered_503_and_closed_and_the_rest_served(server):
    _, url = server
    host, port = url.removeprefix("http://").split(":")
    held = [socket.create_connection((host, int(port)), timeout=30) for _ in range(CONNECTIONS)]
    try:
        time.sleep(0.5)  # every one accepted and given its thread
        status, line = status_and_line(raw(url, b"GET /health HTTP/1.1\r\n\r\n"))
        assert status == 503 and "busy" in line and str(CONNECTIONS) in line
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the held ones' threads end as their sockets close
        try:
            get(url, "/health")
            break
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.1)
    assert post(url, "/v1/completions", {"prompt": "after", "max_tokens": 2})[0] == 200


def test_a_client_that_leaves_before_its_whole_answer_has_its_sequence_cancelled(server):
    _, url = server
    context = get(url, "/v1/models")["data"][0]["max_model_len"]
    before = get(url, "/health")["cancelled"]
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"prompt": [2, 3], "max_tokens": context - 2, "ignore_eos": True}).encode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        deadline = time.monotonic() + 30
        while get(url, "/health")["running"] < 1 and time.monotonic() < deadline:
            time.sleep(0.005)
    # gone, with nothing streamed: the server notices at its next token
    assert idle(url)
    assert get(url, "/health")["cancelled"] == before + 1


def test_sigterm_ends_the_server_cleanly(server):
    proc, url = server
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    rest = proc.stdout.read()
    assert "server stopped" in rest and "Traceback" not in rest
