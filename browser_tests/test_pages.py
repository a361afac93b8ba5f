"""Open every page of the built book in chromium: no real errors, every figure drawn, sliders move.

Known harmless console noise (measured, see shared notes) is told apart from the book's own errors:
anything fetched from another host fails offline (MathJax and friends come from a CDN), and a few
theme/extension messages are expected. A failed request to the book's own server, an uncaught
exception, or an error logged by the book's own scripts fails the test.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from urllib.parse import urlparse

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from conftest import HTML_DIR, built_pages

HARMLESS_CONSOLE = [
    re.compile(p) for p in (
        r"THEBE_JS_URL",                     # sphinx-thebe declares it twice
        r"invalid theme mode",               # pydata theme before its settings load
        r"MathJax",                          # plotly's MathJax set-up vs. Sphinx's
        r"Failed to load resource: net::ERR_(NAME_NOT_RESOLVED|INTERNET_DISCONNECTED|"
        r"CONNECTION_REFUSED|ADDRESS_UNREACHABLE|NETWORK_ACCESS_DENIED|TIMED_OUT|PROXY|TUNNEL)",
    )
]
FIGURE_TIMEOUT_MS = 20_000
DEAD_OUTPUT_MARKERS = ("children=(", "Figure({", "<plotly figure:")


@dataclass
class PageLog:
    """What a page reported while it loaded."""

    host: str
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    failed_local: list[str] = field(default_factory=list)
    failed_remote: list[str] = field(default_factory=list)

    def on_console(self, msg) -> None:
        if msg.type != "error":
            return
        url = (msg.location or {}).get("url", "")
        if url and urlparse(url).netloc != self.host:
            return  # a CDN script's own complaint; it is absent offline anyway
        if not any(p.search(msg.text) for p in HARMLESS_CONSOLE):
            self.console_errors.append(f"{msg.text} ({url})")

    def on_request_failed(self, request) -> None:
        target = self.failed_local if urlparse(request.url).netloc == self.host \
            else self.failed_remote
        target.append(f"{request.url}: {request.failure}")


def _snapshot(page, index: int) -> str:
    """The drawn state of the index-th figure: its traces, title, annotations and shapes."""
    return page.evaluate(
        """(i) => { const el = document.querySelectorAll('.js-plotly-plot')[i];
                    const lay = el.layout || {};
                    return JSON.stringify([el.data, lay.title, lay.annotations, lay.shapes]); }""",
        index,
    )


def _move_slider(page, index: int) -> None:
    """Click the far end of the index-th figure's slider rail (the end it is not already at)."""
    plot = page.locator(".js-plotly-plot").nth(index)
    rail = plot.locator("rect.slider-rail-rect").first
    rail.scroll_into_view_if_needed()
    box = rail.bounding_box()
    active = page.evaluate(
        "(i) => document.querySelectorAll('.js-plotly-plot')[i].layout.sliders[0].active || 0",
        index)
    n_steps = page.evaluate(
        "(i) => document.querySelectorAll('.js-plotly-plot')[i].layout.sliders[0].steps.length",
        index)
    x = box["x"] + (2 if active == n_steps - 1 else box["width"] - 2)
    page.mouse.click(x, box["y"] + box["height"] / 2)


REDIRECT = re.compile(r'http-equiv="Refresh" content="0; url=([^"]+)"', re.IGNORECASE)


def test_page(page_path: str, base_url: str, browser, screenshot_dir) -> None:
    redirect = REDIRECT.search((HTML_DIR / page_path).read_text(errors="replace"))
    if redirect:  # e.g. index.html -> book/intro.html: the target is tested as its own page
        target = (HTML_DIR / page_path).parent / redirect.group(1)
        assert target.is_file(), f"{page_path} redirects to a missing page {redirect.group(1)}"
        return
    url = base_url + page_path
    log = PageLog(host=urlparse(base_url).netloc)
    page = browser.new_page()
    page.on("console", log.on_console)
    page.on("pageerror", lambda exc: log.page_errors.append(str(exc)))
    page.on("requestfailed", log.on_request_failed)
    try:
        page.goto(url, wait_until="load")
        n_figures = page.locator(".servelab-figure").count()
        if n_figures:
            page.wait_for_function(
                """(n) => document.querySelectorAll('.js-plotly-plot svg.main-svg').length >= n""",
                arg=n_figures, timeout=FIGURE_TIMEOUT_MS)
        n_math = page.locator("span.math, div.math").count()
        if n_math:  # MathJax is served by the book (no CDN): every formula must be typeset
            try:
                page.wait_for_function(
                    """(n) => document.querySelectorAll('mjx-container').length >= n""",
                    arg=n_math, timeout=FIGURE_TIMEOUT_MS)
            except PlaywrightTimeout:
                pass  # reported below as raw TeX
        raw_tex = page.locator("span.math:not(:has(mjx-container)), div.math:not(:has(mjx-container))").count()
        plots = page.locator(".js-plotly-plot")
        n_plots = plots.count()
        undrawn = [i for i in range(n_plots)
                   if plots.nth(i).locator("svg.main-svg").count() == 0]
        sliders = [i for i in range(n_plots)
                   if plots.nth(i).locator("rect.slider-rail-rect").count() > 0]
        unchanged = []
        for i in sliders:
            before = _snapshot(page, i)
            _move_slider(page, i)
            page.wait_for_timeout(400)
            if _snapshot(page, i) == before:
                unchanged.append(i)
        page.evaluate("window.scrollTo(0, 0)")
        shot = screenshot_dir / (page_path.replace("/", "__").removesuffix(".html") + ".png")
        page.screenshot(path=str(shot), full_page=True)
        body_text = page.inner_text("article") if page.locator("article").count() else ""
    finally:
        page.close()

    problems = {
        "uncaught exceptions": log.page_errors,
        "console errors from the book": log.console_errors,
        "failed requests to the book itself": log.failed_local,
        "figure divs that never became plotly plots":
            [] if n_figures == n_plots else [f"{n_figures} divs, {n_plots} plots"],
        "plots without an svg": undrawn,
        "formulas left as raw TeX": [f"{raw_tex} of {n_math}"] if raw_tex else [],
        "sliders that did not change their figure": unchanged,
        "outputs shown as text instead of drawn":
            [m for m in DEAD_OUTPUT_MARKERS if m in body_text],
    }
    problems = {k: v for k, v in problems.items() if v}
    assert not problems, f"{page_path}:\n{json.dumps(problems, indent=2)}"


def test_every_page_was_found() -> None:
    """The book has its home page and at least one notebook page (guards against an empty crawl)."""
    pages = built_pages()
    if not pages:
        pytest.fail("no built pages found")
    assert "index.html" in pages
    assert any(p.startswith("notebooks/") for p in pages), pages
