"""The browser the page's tests drive: headless Chromium (Debian's chromium and chromedriver,
`make tools`) through selenium, named to it by path (selenium never fetches a driver); and
where a test keeps its screenshots: ``$UI_TEST_SCREENSHOTS/<test>/`` when that is set (a
folder CI can keep), else the test's tmp folder (pytest keeps the last three sessions')."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver

# The browser's width, its screenshots' (tests/integration/browser.py).
WIDTH = 1360


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    """Headless Chromium. Missing, it fails the test (CI installs it with `make tools`).
    Selenium is imported here, not when the plugin loads: the unit tests never need it."""
    from selenium import webdriver  # noqa: PLC0415
    from selenium.webdriver.chrome.options import Options  # noqa: PLC0415
    from selenium.webdriver.chrome.service import Service  # noqa: PLC0415

    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.fail(
            "chromium and chromedriver are needed: `make tools` installs Debian's chromium"
            " and chromium-driver"
        )
    options = Options()
    options.binary_location = chromium
    # As root (CI, containers) Chromium runs only without its sandbox; /dev/shm may be small.
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    options.add_argument(f"--window-size={WIDTH},900")
    chrome = webdriver.Chrome(options=options, service=Service(executable_path=driver))
    chrome.set_page_load_timeout(60)
    try:
        yield chrome
    finally:
        chrome.quit()


def artefacts() -> Path | None:
    """Where the screenshots kept as test artefacts go (``$UI_TEST_SCREENSHOTS``), if set."""
    root = os.environ.get("UI_TEST_SCREENSHOTS")
    return Path(root) if root else None


@pytest.fixture
def shots(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """The folder this test's screenshots go to (the module's docstring says which)."""
    root = artefacts()
    if root is None:
        return tmp_path / "screenshots"
    return root / re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)
