"""What the page's tests do with the browser (tests/integration/fix_browser.py gives it) and
with a `ductor ui` they start: open a page, read it, wait on it (deadlines, no sleeps), take
its screenshot into a folder (the test's artefacts: fix_browser.py's ``shots``, or
docs/images for the pictures the docs show), and ask the server outside the browser."""

from __future__ import annotations

import base64
import re
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from processor.io.config.settings import Settings

from .children import Spawned
from .fix_browser import WIDTH, artefacts
from .scrape import free_port
from .waiting import wait_for


class Page:
    """The browser on one `ductor ui`; screenshots go to ``shots``."""

    def __init__(self, driver: WebDriver, port: int, shots: Path) -> None:
        self.driver, self.base, self.shots = driver, f"http://127.0.0.1:{port}", shots

    def open(self, path: str) -> None:
        self.driver.get(self.base + path)

    def text(self, css: str) -> str:
        return str(self.driver.find_element(By.CSS_SELECTOR, css).text)

    def has(self, css: str) -> bool:
        return bool(self.driver.find_elements(By.CSS_SELECTOR, css))

    def until(self, predicate: Callable[[], bool], what: str, timeout: float = 30) -> None:
        """Wait for ``predicate``; past ``timeout``, the page as it stood is kept (a
        screenshot named after the wait, its text in the failure) to say why."""
        try:
            # The live page swaps its parts in place: an element found a moment ago may be
            # gone when its text is read (stale). That is a "not yet": ask again.
            WebDriverWait(
                self.driver,
                timeout,
                poll_frequency=0.1,
                ignored_exceptions=(StaleElementReferenceException,),
            ).until(lambda _d: predicate(), f"timed out waiting for {what}")
        except TimeoutException:
            # Beside the test artefacts, never among the docs' pictures some tests take.
            folder = artefacts() or Path(tempfile.gettempdir())
            name = "timeout-" + re.sub(r"[^A-Za-z0-9]+", "-", what).strip("-") + ".png"
            shot = self.screenshot(name, folder / "failures")
            body = self.driver.find_element(By.TAG_NAME, "body").text
            raise AssertionError(
                f"timed out after {timeout:.0f} s waiting for {what} on "
                f"{self.driver.current_url} (screenshot: {shot}); the page said:\n{body[:3000]}"
            ) from None

    def column(self, table: str, index: int) -> list[str]:
        cells = self.driver.find_elements(By.CSS_SELECTOR, f"{table} tbody td:nth-child({index})")
        return [str(c.text) for c in cells]

    def script(self, code: str, *args: Any) -> Any:
        return self.driver.execute_script(code, *args)

    def style(self, css: str, prop: str) -> str:
        """A computed style of the first element ``css`` selects (colours as ``rgb(r, g, b)``)."""
        return str(
            self.script(
                "return getComputedStyle(document.querySelector(arguments[0]))[arguments[1]]",
                css,
                prop,
            )
        )

    def screenshot(self, name: str, folder: Path | None = None) -> Path:
        """The whole page, as tall as its content (Chromium's own screenshot beyond the
        window: a window is no taller than the headless screen), into ``shots``."""
        assert isinstance(self.driver, webdriver.Chrome)
        size = self.driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": WIDTH, "height": size["height"], "scale": 1}
        shot = self.driver.execute_cdp_cmd(
            "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
        )
        folder = self.shots if folder is None else folder
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / name
        path.write_bytes(base64.b64decode(shot["data"]))
        return path


def start_ui(
    spawn: Callable[..., Spawned],
    settings: Settings,
    token: str,
    name: str,
    env: dict[str, str] | None = None,
) -> int:
    """A `ductor ui` subprocess with ``token`` (empty: read-only), answering; its port."""
    port = free_port()
    ui = spawn(
        ["ui", "--port", str(port)], settings, name, env={"DUCTOR_UI_TOKEN": token, **(env or {})}
    )
    wait_for(lambda: ui.running() and status_of(port, "/") in (200, 303), 60, f"{name} to answer")
    return port


def status_of(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def post(port: int, path: str, fields: dict[str, str], headers: dict[str, str]) -> int:
    """A form POSTed outside the browser: the status it is answered with."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=urllib.parse.urlencode(fields).encode(),
        headers=headers,
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return exc.code
