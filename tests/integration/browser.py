"""Headless Chromium for the browser tests (Debian's ``chromium`` and ``chromedriver``, installed by
scripts/setup.sh as root; Selenium drives them): the driver, page loading with the console's errors, a
blank-screenshot check and a real mouse hover over a heatmap cell."""

from __future__ import annotations

import contextlib
import io
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")


def skip_without_browser() -> None:
    """Skip the calling test module, saying why, where Plotly, Selenium or the browser is missing."""
    pytest.importorskip("plotly", reason="the views need Plotly: pip install gpt2-interp[views]")
    pytest.importorskip(
        "selenium", reason="the browser tests drive Chromium with Selenium: pip install gpt2-interp[browser]"
    )
    if not (CHROMIUM and DRIVER):
        pytest.skip(
            "no headless browser: install Debian's chromium and chromium-driver (scripts/setup.sh does, as root)",
            allow_module_level=True,
        )


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium browser (1280 × 1000) that keeps the console log; quit on exit."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,1000",
    ):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    driver.set_page_load_timeout(120)
    try:
        yield driver
    finally:
        driver.quit()


def open_page(driver: Any, path: Path) -> list[str]:
    """Load ``path`` from disk; the console's errors and warnings (none expected)."""
    driver.get(path.resolve().as_uri())
    assert driver.execute_script("return document.readyState") == "complete"
    return [e["message"] for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]


def not_blank(driver: Any) -> float:
    """The grey-level standard deviation of a screenshot (a blank page: 0)."""
    from PIL import Image

    img = Image.open(io.BytesIO(driver.get_screenshot_as_png())).convert("L")
    return float(np.asarray(img, dtype=float).std())


def hover_cell(driver: Any, fig: Any, row: int, col: int, n_rows: int, n_cols: int, top_down: bool) -> str:
    """Move the mouse over cell (row, col) of the first heatmap of ``fig``; the hover label's text."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    drag = fig.find_element(By.CSS_SELECTOR, ".nsewdrag")
    w, h = drag.size["width"], drag.size["height"]
    y_frac = (row + 0.5) / n_rows if top_down else 1 - (row + 0.5) / n_rows
    dx, dy = int((col + 0.5) / n_cols * w - w / 2), int(y_frac * h - h / 2)
    ActionChains(driver).move_to_element_with_offset(drag, dx, dy).perform()
    for _ in range(50):
        text = driver.execute_script(
            "var h = arguments[0].querySelector('.hoverlayer'); return h && h.textContent", fig
        )
        if text:
            return text
        time.sleep(0.05)
    return ""
