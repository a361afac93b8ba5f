"""Fixtures for the browser test: the built book served on 127.0.0.1 and a headless Debian chromium.

The book is looked for in ``_build/html`` (override with ``SERVELAB_HTML_DIR``); build it first
(``make book-strict``). Chromium is Debian's (``make browser-deps``), driven by PyPI playwright;
playwright is never allowed to download a browser of its own.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HTML_DIR = Path(os.environ.get("SERVELAB_HTML_DIR", ROOT / "_build" / "html")).resolve()
SCREENSHOT_DIR = HTML_DIR.parent / "screenshots"
CHROMIUM = os.environ.get("SERVELAB_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
SKIPPED_DIRS = {"_static", "_sources", "_images", "_sphinx_design_static", "_panels_static"}


def built_pages() -> list[str]:
    """Every HTML page of the built book, as paths relative to its root."""
    if not HTML_DIR.is_dir():
        return []
    return sorted(
        str(p.relative_to(HTML_DIR)) for p in HTML_DIR.rglob("*.html")
        if not SKIPPED_DIRS.intersection(p.relative_to(HTML_DIR).parts)
    )


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args) -> None:  # noqa: A002 - the base class's name
        pass


@pytest.fixture(scope="session")
def base_url() -> Iterator[str]:
    """The built book served from a background thread on a free port of 127.0.0.1."""
    if not (HTML_DIR / "index.html").is_file():
        pytest.fail(f"no built book at {HTML_DIR}: run `make book-strict` first")
    handler = functools.partial(_QuietHandler, directory=str(HTML_DIR))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="session")
def browser():
    """A headless Debian chromium with a fresh profile."""
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"{CHROMIUM} not found: run `make browser-deps` (apt-get install chromium)")
    os.environ["PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD"] = "1"
    from playwright.sync_api import sync_playwright

    profile = tempfile.mkdtemp(prefix="servelab-chromium-")
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True,
            args=[*CHROMIUM_FLAGS], viewport={"width": 1280, "height": 900},
        )
        try:
            yield context
        finally:
            context.close()
            shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="session")
def screenshot_dir() -> Path:
    SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
    return SCREENSHOT_DIR


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "page_path" in metafunc.fixturenames:
        # With no built book, the one "index.html" case fails in base_url with a clear message.
        metafunc.parametrize("page_path", built_pages() or ["index.html"])
