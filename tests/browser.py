"""A headless Chromium driven over the Chrome DevTools Protocol, with the standard library only.

Chromium is started with --remote-debugging-pipe: it reads commands on its fd 3 and writes replies and
events on its fd 4, each message JSON ended by a NUL byte. One page target is attached in flat mode (its
messages carry a sessionId); Runtime, Log, Network and Page are enabled on it, and every event it sends
is kept (`events`), so a test can look for console errors, exceptions and requests afterwards.

Also a minimal PNG reader (`png_pixels`: zlib and the five scanline filters), enough to tell a blank
screenshot from one with drawings in it.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import struct
import subprocess
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

BINARIES = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")
DEBIAN_SHELL = Path("/usr/lib/chromium/chromium-headless-shell")  # where Debian's package puts the binary


def find_chromium() -> str | None:
    """The first Chromium on PATH (the headless shell first), or None."""
    for name in BINARIES:
        found = shutil.which(name)
        if found:
            return found
    return str(DEBIAN_SHELL) if DEBIAN_SHELL.exists() else None


class CdpError(RuntimeError):
    """Chromium answered a command with an error, or did not answer in time."""


class Browser:
    """One Chromium process and one page in it; use as a context manager."""

    def __init__(self, binary: str, *, width: int = 1280, height: int = 900, timeout_s: float = 30.0) -> None:
        self.width, self.height, self.timeout_s = width, height, timeout_s
        self.events: list[dict[str, Any]] = []
        self._next_id = 0
        self._buffer = b""
        self._profile = tempfile.TemporaryDirectory(prefix="ddlbench-chromium-")
        self._log = open(Path(self._profile.name) / "chromium.log", "wb")  # noqa: SIM115 (closed in close())
        # the pipes, moved above fd 10 so that placing them on 3 and 4 in the child cannot clobber one another
        commands_read, commands_write = (_high(fd) for fd in os.pipe())
        replies_read, replies_write = (_high(fd) for fd in os.pipe())

        def place_pipes() -> None:  # in the child, before exec: its fd 3 reads commands, fd 4 writes replies
            os.dup2(commands_read, 3)
            os.dup2(replies_write, 4)

        arguments = [
            binary,
            "--headless",
            "--no-sandbox",  # the tests run as root
            "--disable-gpu",
            "--remote-debugging-pipe",
            f"--user-data-dir={self._profile.name}",
            f"--window-size={width},{height}",
            "--hide-scrollbars",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--mute-audio",
            "about:blank",
        ]
        self.process = subprocess.Popen(
            arguments,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
            close_fds=False,  # fds 3 and 4 must survive exec; every other fd of ours is close-on-exec
            preexec_fn=place_pipes,  # runs in the child between fork and exec
        )
        os.close(commands_read)
        os.close(replies_write)
        self._write, self._read = commands_write, replies_read
        try:
            targets = self.send("Target.getTargets")["targetInfos"]
            page = next(t["targetId"] for t in targets if t["type"] == "page")
            self.session = self.send("Target.attachToTarget", {"targetId": page, "flatten": True})["sessionId"]
            for domain in ("Runtime", "Log", "Network", "Page"):
                self.send(f"{domain}.enable", session=True)
            self.send(
                "Emulation.setDeviceMetricsOverride",
                {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
                session=True,
            )
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(CdpError, OSError):
                self.send("Browser.close", timeout_s=5)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for fd in (self._write, self._read):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._log.close()
        self._profile.cleanup()

    def log_text(self) -> str:
        """What Chromium printed (for a failing test's message)."""
        path = Path(self._profile.name) / "chromium.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    # --- the protocol -----------------------------------------------------------------------------------

    def send(
        self, method: str, params: dict[str, Any] | None = None, *, session: bool = False, timeout_s: float = 0
    ) -> dict[str, Any]:
        """Send a command (to the page's session when `session`) and return its result; events that arrive
        meanwhile are kept in `events`."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self.session
        data = json.dumps(message).encode() + b"\0"
        while data:
            data = data[os.write(self._write, data) :]
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        while True:
            reply = self._receive(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise CdpError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def wait_for(self, method: str, *, timeout_s: float = 0) -> dict[str, Any]:
        """The first event named `method` kept or yet to come."""
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        seen = 0
        while True:
            for event in self.events[seen:]:
                if event["method"] == method:
                    return event
            seen = len(self.events)
            message = self._receive(deadline)
            if "method" in message:
                self.events.append(message)

    def _receive(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CdpError(f"no reply from Chromium in time; its log:\n{self.log_text()}")
            ready, _, _ = select.select([self._read], [], [], left)
            if ready:
                chunk = os.read(self._read, 1 << 20)
                if not chunk:
                    raise CdpError(f"Chromium closed its pipe; its log:\n{self.log_text()}")
                self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    # --- what tests do with a page -------------------------------------------------------------------------

    def open(self, url: str) -> None:
        """Navigate the page and wait for its load event."""
        self.events = [e for e in self.events if e["method"] != "Page.loadEventFired"]
        self.send("Page.navigate", {"url": url}, session=True)
        self.wait_for("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (awaited when it is a promise)."""
        result = self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
            session=True,
        )
        if "exceptionDetails" in result:
            raise CdpError(f"{expression[:80]}…: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, clip: dict[str, float] | None = None) -> bytes:
        """A PNG of the viewport, or of `clip` (page coordinates: x, y, width, height, scale)."""
        params: dict[str, Any] = {"format": "png"}
        if clip is not None:
            params |= {"clip": {"scale": 1, **clip}, "captureBeyondViewport": True}
        return base64.b64decode(self.send("Page.captureScreenshot", params, session=True)["data"])

    def problems(self, allowed_url: str) -> list[str]:
        """Console errors and warnings, exceptions, logged errors and any request for something else than
        `allowed_url` (or a data: URL), as lines."""
        found = []
        for event in self.events:
            method, params = event["method"], event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "warning", "assert"):
                texts = [str(arg.get("value", arg.get("description", ""))) for arg in params.get("args", [])]
                found.append(f"console.{params['type']}: {' '.join(texts)}")
            elif method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                found.append(f"exception: {details.get('exception', {}).get('description') or details.get('text')}")
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                found.append(f"log: {params['entry'].get('text')} ({params['entry'].get('url', '')})")
            elif method == "Network.requestWillBeSent":
                url = params.get("request", {}).get("url", "")
                if url != allowed_url and not url.startswith("data:"):
                    found.append(f"request: {url}")
        return found


def _high(fd: int) -> int:
    """The same pipe end on a descriptor ≥ 10, close-on-exec."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return moved


def png_pixels(png: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of raw pixel bytes) of an 8-bit RGB or RGBA, non-interlaced PNG."""
    if png[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    position, chunks, header = 8, [], b""
    while position < len(png):
        (length,) = struct.unpack(">I", png[position : position + 4])
        kind = png[position + 4 : position + 8]
        body = png[position + 8 : position + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            chunks.append(body)
        position += 12 + length
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    if depth != 8 or colour not in (2, 6) or interlace:
        raise ValueError(f"PNG of bit depth {depth}, colour type {colour}, interlace {interlace}: not read here")
    channels = 3 if colour == 2 else 4
    stride = width * channels
    data = zlib.decompress(b"".join(chunks))
    rows, previous = [], bytearray(stride)
    for y in range(height):
        kind, line = data[y * (stride + 1)], bytearray(data[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        _unfilter(kind, line, previous, channels)
        rows.append(bytes(line))
        previous = line
    return width, height, rows


def _unfilter(kind: int, line: bytearray, above: bytearray, step: int) -> None:
    if kind == 0:
        return
    if kind == 2:
        line[:] = bytes((a + b) & 0xFF for a, b in zip(line, above, strict=True))
        return
    for i in range(len(line)):
        left = line[i - step] if i >= step else 0
        up = above[i]
        if kind == 1:
            line[i] = (line[i] + left) & 0xFF
        elif kind == 3:
            line[i] = (line[i] + (left + up) // 2) & 0xFF
        elif kind == 4:
            corner = above[i - step] if i >= step else 0
            guess = left + up - corner
            near_left, near_up, near_corner = abs(guess - left), abs(guess - up), abs(guess - corner)
            if near_left <= near_up and near_left <= near_corner:
                best = left
            elif near_up <= near_corner:
                best = up
            else:
                best = corner
            line[i] = (line[i] + best) & 0xFF
        else:
            raise ValueError(f"unknown PNG filter {kind}")


def colour_census(png: bytes) -> tuple[int, float]:
    """(distinct colours, share of pixels that are not white) of a PNG."""
    width, _, rows = png_pixels(png)
    channels = len(rows[0]) // width if rows else 3
    colours: set[bytes] = set()
    inked = total = 0
    for row in rows:
        for x in range(0, len(row), channels):
            pixel = row[x : x + 3]
            colours.add(pixel)
            total += 1
            inked += pixel != b"\xff\xff\xff"
    return len(colours), inked / max(total, 1)
