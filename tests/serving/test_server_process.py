"""python -m src.serve as a real process on loopback, under the faults a server meets: a malformed body, a prompt
longer than the context, a client that leaves mid-stream, 100 requests at once over a queue of 10. Each is
answered (an error in one line where it cannot be served), no other request is lost, and SIGTERM ends the
process cleanly."""

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

from tests.helpers import ROOT, cli_env

START_S = 180  # the model's build and the kernels' load on a busy host


@pytest.fixture(scope="module")
def server():
    proc = subprocess.Popen(
        [sys.executable, "-m", "src.serve", "model=tiny-gemma3", "precision=fp32", "task.port=0",
         "task.max_sequences=2", "task.max_waiting=10", "task.max_batch_tokens=8"],
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
    assert status == 400 and "not JSON" in json.loads(body)["error"]["message"]
    context = get(url, "/v1/models")["data"][0]["max_model_len"]
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
    assert len(served) >= 12 and busy and all("busy" in m for m in busy)
    assert idle(url)


def test_sigterm_ends_the_server_cleanly(server):
    proc, url = server
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    rest = proc.stdout.read()
    assert "server stopped" in rest and "Traceback" not in rest
