"""A real browser page driven over the Chrome DevTools Protocol (headless Chromium, websocket-client): open an
address, read what is drawn and the address the page rewrote itself to, reload, take a screenshot. One browser
serves every look a test takes at a page: a one-shot `chromium --dump-dom` cannot follow a page across a reload,
and started anew for each look (Chromium and MLflow's app loaded again) it took ~12 s a look on one core."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from itertools import count

import websocket

BROWSER = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)


class Page:
    """One tab of a headless Chromium of its own (its profile in a temporary folder, removed on close)."""

    def __init__(self, port: int, width: int = 1920, height: int = 1000):
        self._height = height
        self._profile = tempfile.mkdtemp(prefix="quantspec-chromium-")
        self._proc = subprocess.Popen(
            [
                BROWSER,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--disable-background-networking",
                "--no-first-run",
                f"--window-size={width},{height}",
                f"--remote-debugging-port={port}",
                "--remote-allow-origins=*",
                f"--user-data-dir={self._profile}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.time() + 60
        while True:
            try:
                targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json", timeout=2).read())
                page = next(t for t in targets if t["type"] == "page")
                break
            except (OSError, StopIteration, ValueError):
                if time.time() > deadline or self._proc.poll() is not None:
                    self.close()
                    raise RuntimeError("headless Chromium did not open its debugging port") from None
                time.sleep(0.3)
        self._ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60)
        self._ids = count(1)

    def send(self, method: str, **params) -> dict:
        n = next(self._ids)
        self._ws.send(json.dumps({"id": n, "method": method, "params": params}))
        while True:
            message = json.loads(self._ws.recv())
            if message.get("id") == n:
                return message.get("result", {})

    def evaluate(self, expression: str):
        return self.send("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def wait_for(self, expression: str | list[str], timeout: float = 60):
        """Poll `expression` in the page until it is truthy; its value. A list: every one of them at once (True),
        and where they never were, the error names those still false."""
        conditions = [expression] if isinstance(expression, str) else expression
        joined = " && ".join(f"({c})" for c in conditions)
        deadline = time.time() + timeout
        while time.time() < deadline:
            value = self.evaluate(joined)
            if value:
                return value
            time.sleep(0.5)
        unmet = [c for c in conditions if not self.evaluate(c)]
        raise TimeoutError(f"the page never satisfied, in {timeout:g} s: {'; '.join(unmet) or joined}")

    def open(self, url: str) -> None:
        self.send("Page.navigate", url=url)

    def reload(self) -> None:
        self.send("Page.reload", ignoreCache=True)

    def screenshot(self, path, width: int | None = None) -> None:
        """The page as drawn, as a PNG at `path`; at `width` (the tab's own width otherwise), the page laid out
        again at that width for the shot and put back after."""
        import base64

        if width is not None:
            self.send(
                "Emulation.setDeviceMetricsOverride",
                width=width,
                height=self._height,
                deviceScaleFactor=1,
                mobile=False,
            )
            # two frames drawn at that width before the shot
            self.send(
                "Runtime.evaluate",
                expression="new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))",
                awaitPromise=True,
            )
        try:
            data = self.send("Page.captureScreenshot", format="png")["data"]
        finally:
            if width is not None:
                self.send("Emulation.clearDeviceMetricsOverride")
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        try:
            self._ws.close()
        except Exception:  # noqa: BLE001 - closing what may be half open
            pass
        self._proc.kill()
        self._proc.wait()
        shutil.rmtree(self._profile, ignore_errors=True)
