"""task=serve's peer servers (src.tasks.serve): each a process of its own, waited for until it answers /health,
ended with its children when the task ends; one that dies at start or is missing is said in one line."""

import os
import sys
import time
from types import SimpleNamespace

import pytest

from src.tasks import loadgen, serve

# a server that answers /health after a moment and starts a child of its own (as vLLM's engine core is)
SERVER = """
import http.server, os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
open(sys.argv[2], "w").write(f"{os.getpid()} {child.pid}")
time.sleep(0.5)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_peer_is_waited_for_and_ends_with_its_children(tmp_path):
    port, pids = serve._free_port(), tmp_path / "pids"
    with serve._process("peer", [sys.executable, "-c", SERVER, str(port), str(pids)], port, 30) as served:
        assert served.url == f"http://127.0.0.1:{port}"
        server, child = map(int, pids.read_text().split())
        assert not _gone(server) and not _gone(child)
    deadline = time.monotonic() + 10
    while not (_gone(server) and _gone(child)) and time.monotonic() < deadline:  # the child is reaped by init
        time.sleep(0.1)
    assert _gone(server) and _gone(child)


def test_a_peer_that_dies_at_start_is_its_last_line():
    port = serve._free_port()
    cmd = [sys.executable, "-c", "import sys; print('loading'); sys.exit('no such model: /nowhere')"]
    start = time.monotonic()
    with pytest.raises(loadgen.LoadGenError, match=r"^vLLM exited 1 at start: no such model: /nowhere$"):
        with serve._process("vLLM", cmd, port, 30):
            pass
    assert time.monotonic() - start < 10


def test_a_missing_vllm_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.delenv("QUANTSPEC_VLLM", raising=False)
    with pytest.raises(loadgen.LoadGenError, match=r"^no vLLM at .*: run `bash scripts/install_vllm`"):
        serve.vllm_python(tmp_path)


def test_a_peer_that_dies_while_serving_says_how_it_ended():
    port = serve._free_port()
    dies = SERVER.replace(
        "http.server.HTTPServer(",
        "import threading; threading.Timer(1.0, lambda: os._exit(7)).start()\nhttp.server.HTTPServer(",
    )
    with serve._process("llama-server", [sys.executable, "-c", dies, str(port), os.devnull], port, 30) as served:
        assert served.problem() is None
        deadline = time.monotonic() + 20
        while served.problem() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert served.problem().startswith("(llama-server) exited 7")


def test_completed_requests_the_server_never_answered_are_not_recorded():
    server = serve.Served("http://127.0.0.1:9", "m", "quantspec", answered=lambda: 10)
    serve._served_what_it_counts(server, {"serve_requests": 10.0})
    with pytest.raises(loadgen.LoadGenError, match="aiperf counts 12 completed requests, but the server answered 10"):
        serve._served_what_it_counts(server, {"serve_requests": 12.0})


def test_a_server_already_running_is_asked_for_the_model_it_lists():
    """task.base_url: quantspec's own server (in this process) stands for one started by hand."""

    from src.serving import http
    from tests.engine.tiny import model_at

    model, tok = model_at("gemma3", "fp32")
    server = http.start(http.App(model, tok, "by-hand", 128, http.Settings()))
    try:
        found = serve._external(SimpleNamespace(base_url=server.url() + "/v1/", served_model=None))
        assert (found.url, found.model, found.name) == (server.url(), "by-hand", "external")
        named = serve._external(SimpleNamespace(base_url=server.url(), served_model="other"))
        assert named.model == "other"  # asked for as given: the server's own 404 then says it has none
    finally:
        server.close()


def test_an_address_where_nothing_listens_is_one_line_saying_so():
    port = serve._free_port()  # free now: nothing listens there
    start = time.monotonic()
    with pytest.raises(loadgen.LoadGenError, match=r"did not answer GET /v1/models .*start the server") as err:
        serve._external(SimpleNamespace(base_url=f"http://127.0.0.1:{port}", served_model=None))
    assert "\n" not in str(err.value) and time.monotonic() - start < 10
