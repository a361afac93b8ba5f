"""Open every page of the built book in chromium: no real errors, every figure drawn, sliders move,
no two text boxes of a figure overlap, nothing is wider than the reading column.

Screenshots: the whole page as it opens (every slider figure at its default frame), and each slider
figure again after its slider was moved (``<page>__figN-moved.png``). The cheat sheets must print on
one page.

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
from conftest import HTML_DIR, ROOT, built_pages

LAYOUT_CHECKS = ROOT / "browser_tests" / "layout_checks.js"
ONE_PAGE_PRINTS = ("book/cheatsheet.html", "book/cheatsheet-zh.html")

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


def _overlaps(page, index: int) -> list[str]:
    return page.evaluate(
        "(i) => window.servelabTextBoxOverlaps(document.querySelectorAll('.js-plotly-plot')[i])", index)


def _tick_order(page, index: int) -> list[str]:
    return page.evaluate(
        "(i) => window.servelabTickOrder(document.querySelectorAll('.js-plotly-plot')[i])", index)


def _column_overflow(page) -> list[str]:
    return page.evaluate(
        "() => { const c = document.querySelector('article.bd-article') || document.querySelector('main');"
        " return c ? window.servelabOverflowing(c) : []; }")


def printed_pages(page) -> int:
    """How many sheets the page prints on (A4, the page's own print styles)."""
    page.emulate_media(media="print")
    pdf = page.pdf(format="A4", print_background=False)
    page.emulate_media(media="screen")
    return len(re.findall(rb"/Type\s*/Page(?!s)", pdf))


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
        page.add_script_tag(path=str(LAYOUT_CHECKS))
        overlapping = [f"figure {i} (as drawn): {hit}" for i in range(n_plots) for hit in _overlaps(page, i)]
        too_wide = _column_overflow(page)
        disordered = [f"figure {i}: {hit}" for i in range(n_plots) for hit in _tick_order(page, i)]
        page.evaluate("window.scrollTo(0, 0)")
        stem = page_path.replace("/", "__").removesuffix(".html")
        page.screenshot(path=str(screenshot_dir / f"{stem}.png"), full_page=True)  # default frames
        unchanged = []
        for i in sliders:
            before = _snapshot(page, i)
            _move_slider(page, i)
            page.wait_for_timeout(400)
            if _snapshot(page, i) == before:
                unchanged.append(i)
            overlapping += [f"figure {i} (slider moved): {hit}" for hit in _overlaps(page, i)]
            plots.nth(i).screenshot(path=str(screenshot_dir / f"{stem}__fig{i}-moved.png"))
        sheets = printed_pages(page) if page_path in ONE_PAGE_PRINTS else 1
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
        "text boxes of a figure that overlap": overlapping,
        "elements wider than the reading column": too_wide,
        "tick labels not in order of value": disordered,
        "does not print on exactly one page": [f"{sheets} pages"] if sheets != 1 else [],
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


def test_layout_checks_catch_overlaps_and_overflow(browser) -> None:
    """The two layout checks fail on a figure whose legend sits on its slider and on a wide block."""
    import plotly
    from pathlib import Path

    plotly_js = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    page = browser.new_page()
    try:
        page.set_content('<article class="bd-article" style="width:600px"><div id="f" style="height:400px">'
                         '</div><pre style="width:900px">wide</pre></article>')
        page.add_script_tag(path=str(plotly_js))
        page.evaluate("""() => Plotly.newPlot('f',
            [{x: [1, 2], y: [1, 2], name: 'one'}, {x: [1, 2], y: [2, 1], name: 'two'}],
            {legend: {orientation: 'h', y: -0.2}, sliders: [{currentvalue: {prefix: 'value = '},
             steps: [{label: 'a', method: 'skip'}, {label: 'b', method: 'skip'}]}]})""")
        page.add_script_tag(path=str(LAYOUT_CHECKS))
        hits = _overlaps(page, 0)
        wide = _column_overflow(page)
    finally:
        page.close()
    assert any("legend" in h and "slider" in h for h in hits), hits
    assert any(h.startswith("pre") for h in wide), wide


def test_tick_order_check_catches_minor_log_labels(browser) -> None:
    """plotly's own log labels ("2 5 2 100") fail the tick check; the course's decade labels pass."""
    import json
    from pathlib import Path

    import plotly
    import plotly.graph_objects as go

    from servelab.viz.ticks import label_log_axes

    plotly_js = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    spec = {"data": [{"x": [3, 40, 900], "y": [1, 2, 3]}], "layout": {"xaxis": {"type": "log"}}}
    fixed = label_log_axes(json.loads(go.Figure(spec).to_json()))
    page = browser.new_page()
    try:
        page.set_content('<div id="a" style="width:600px;height:300px"></div>'
                         '<div id="b" style="width:600px;height:300px"></div>')
        page.add_script_tag(path=str(plotly_js))
        page.evaluate("(s) => Plotly.newPlot('a', s.data, s.layout)", spec)
        page.evaluate("(s) => Plotly.newPlot('b', s.data, s.layout)", fixed)
        page.add_script_tag(path=str(LAYOUT_CHECKS))
        plain, labelled = _tick_order(page, 0), _tick_order(page, 1)
    finally:
        page.close()
    assert plain and "xaxislayer" in plain[0], plain
    assert not labelled, labelled
