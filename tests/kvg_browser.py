"""Headless Chromium for the HTML report's tests: Debian's /usr/bin/chromium driven by Playwright (its own browser
download does not work offline, and is never used). Every request a page makes is routed and counted; console
messages and page errors are collected. Skips locally when Playwright or Chromium is missing; fails in CI."""

from __future__ import annotations

import os
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kvg_testing import IN_CI

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _missing(msg: str) -> None:
    if IN_CI:
        pytest.fail(msg)
    pytest.skip(msg)


@dataclass
class Opened:
    """A report opened in a tab: the page, what it asked for, and what it logged."""

    page: Any
    requests: list[str] = field(default_factory=list)  # every URL the page tried to load (the file itself too)
    console: list[tuple[str, str]] = field(default_factory=list)  # (type, text)
    errors: list[str] = field(default_factory=list)  # uncaught exceptions

    @property
    def console_errors(self) -> list[str]:
        return [t for kind, t in self.console if kind in ("error", "warning")] + self.errors

    def network(self, url: str) -> list[str]:
        """Requests other than the report file itself."""
        return [u for u in self.requests if u != url]


class Browser:
    def __init__(self, browser: Any) -> None:
        self.browser = browser

    @contextmanager
    def open(self, path: Path, *, js: bool = True, width: int = 1280, height: int = 900) -> Iterator[Opened]:
        ctx = self.browser.new_context(java_script_enabled=js, viewport={"width": width, "height": height},
                                       service_workers="block")
        try:
            page = ctx.new_page()
            opened = Opened(page)
            url = path.resolve().as_uri()

            def route(r: Any) -> None:
                opened.requests.append(r.request.url)
                if r.request.url == url:
                    r.continue_()
                else:
                    r.abort()

            ctx.route("**/*", route)
            page.on("request", lambda req: None if req.url in opened.requests else opened.requests.append(req.url))
            page.on("console", lambda m: opened.console.append((m.type, m.text)))
            page.on("pageerror", lambda e: opened.errors.append(str(e)))
            page.goto(url, wait_until="load")
            yield opened
        finally:
            ctx.close()


@contextmanager
def chromium() -> Iterator[Browser]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed; run ./scripts/setup.sh --dev")
    if not os.path.exists(CHROMIUM):
        _missing(f"{CHROMIUM} is not installed; run ./scripts/setup.sh --services")
    with sync_playwright() as p:
        # launch() gives the browser a fresh temporary user-data-dir and removes it on close
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            yield Browser(browser)
        finally:
            browser.close()


def pixel_stdev(png: Path) -> float:
    """Standard deviation of the grey levels of a screenshot: 0 for a blank (one-colour) image."""
    from PIL import Image

    with Image.open(png) as im:
        grey = im.convert("L")
        grey.thumbnail((400, 400))
        return statistics.pstdev(grey.tobytes())


def axe_violations(page: Any) -> list[dict[str, Any]]:
    """axe-core's serious and critical violations on the page (axe-playwright-python runs axe-core's own
    script from its package)."""
    try:
        from axe_playwright_python.sync_playwright import Axe
    except ImportError:
        _missing("axe-playwright-python is not installed; run ./scripts/setup.sh --dev")
    result = Axe().run(page)
    return [v for v in result.response["violations"] if v.get("impact") in ("serious", "critical")]
