"""Debian's headless Chromium, driven like a person: open a page, wait for it, click, read, screenshot.

It speaks the DevTools protocol over a pipe (`--remote-debugging-pipe`: JSON messages ended by NUL,
read by Chromium on fd 3 and answered on fd 4), so no driver or extra package is needed, and a
click is a real mouse event (the MLflow UI shows a sweep's children only after clicking its parent's
expander, which `--dump-dom` cannot do).
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path

from helpers.processes import stop_group, wait_group
from helpers.waiting import wait_for

# The machine has no outside network: without these, Chromium keeps trying to reach Google's services.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


class Chromium:
    def __init__(self, user_data_dir: Path, log: Path, width: int = 1600, height: int = 1000):
        executable = shutil.which("chromium")
        if executable is None:
            raise RuntimeError("no `chromium` on PATH: apt-get install -y --no-install-recommends chromium")
        commands_read, self._commands = os.pipe()
        self._replies, replies_write = os.pipe()

        def on_fds_3_and_4():
            # Moved above 9 first, so that placing one on fd 3 or 4 cannot overwrite the other.
            high_read = fcntl.fcntl(commands_read, fcntl.F_DUPFD, 10)
            high_write = fcntl.fcntl(replies_write, fcntl.F_DUPFD, 10)
            os.dup2(high_read, 3)
            os.dup2(high_write, 4)

        with open(log, "wb") as stderr:
            self.process = subprocess.Popen(
                [
                    executable,
                    *FLAGS,
                    f"--user-data-dir={user_data_dir}",
                    f"--window-size={width},{height}",
                    "--remote-debugging-pipe",
                    "about:blank",
                ],
                stdin=subprocess.DEVNULL,
                stdout=stderr,
                stderr=stderr,
                preexec_fn=on_fds_3_and_4,
                pass_fds=(3, 4),
                start_new_session=True,
            )
        os.close(commands_read)
        os.close(replies_write)
        self._buffer = b""
        self._next_id = 0
        self._session: str | None = None

    # The protocol
    def send(self, method: str, params: dict | None = None, timeout: float = 30) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if self._session is not None:
            message["sessionId"] = self._session
        data = json.dumps(message).encode() + b"\0"
        while data:
            data = data[os.write(self._commands, data) :]
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline, method)
            if reply.get("id") == self._next_id:  # anything else is an event nobody asked for
                if "error" in reply:
                    raise RuntimeError(f"Chromium refused {method}: {reply['error']}")
                return reply.get("result", {})

    def _read(self, deadline: float, method: str) -> dict:
        while b"\0" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"Chromium did not answer {method}")
            if select.select([self._replies], [], [], remaining)[0]:
                chunk = os.read(self._replies, 1 << 20)
                if not chunk:
                    raise RuntimeError(f"Chromium closed its pipe (exit {self.process.poll()}) during {method}")
                self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)

    # What a person does
    def open(self, url: str) -> None:
        """Navigate the tab Chromium started with (it has the window's size) to url."""
        self._session = None
        page = next(t for t in self.send("Target.getTargets")["targetInfos"] if t["type"] == "page")
        self._session = self.send("Target.attachToTarget", {"targetId": page["targetId"], "flatten": True})["sessionId"]
        self.send("Page.navigate", {"url": url})

    def evaluate(self, expression: str):
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r} raised in the page: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 60):
        """Poll a JavaScript expression until it is truthy (the page renders asynchronously); its value."""
        return wait_for(
            lambda: self.evaluate(expression),
            timeout,
            f"the page to satisfy {expression!r}",
            every=0.25,
            detail=lambda: f"it shows:\n{self.text()[:3000]}",
        )

    def click(self, selector: str) -> None:
        """A left click in the middle of the element, as mouse events (React sees a real click)."""
        centre = self.wait_for(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return null;"
            " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
            " return r.width > 0 ? [r.x + r.width / 2, r.y + r.height / 2] : null; })()"
        )
        x, y = centre
        self.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1})

    def text(self) -> str:
        """What the page shows as text (rendered, visible text, not the DOM's hidden parts)."""
        return self.evaluate("document.body ? document.body.innerText : ''") or ""

    def screenshot(self, path: Path) -> Path:
        path.write_bytes(base64.b64decode(self.send("Page.captureScreenshot", {"format": "png"})["data"]))
        return path

    def close(self) -> None:
        """Ask Chromium to quit, as closing its window would; stop its process group if it does not."""
        try:
            self._session = None
            self.send("Browser.close", timeout=10)
        except (OSError, RuntimeError, TimeoutError):
            pass  # it may close the pipe before answering; the group check below is what counts
        finally:
            os.close(self._commands)
            os.close(self._replies)
            if not wait_group(self.process, 15):
                stop_group(self.process)
            self.process.wait(timeout=30)
