"""Static checks of the built HTML (no browser): every internal link lands, and readers see no build
or source-document jargon.

Links: every ``href`` of every page that stays inside the book (question bank, glossary, cheat
sheets, cross-references, the sidebar) must name a file that exists and, when it carries
``#anchor``, an element with that id on the target page.

Text: the visible text of each page must not mention nbval markers or the documents the course was
written from ("the seed's table", "seed workload"); a random seed is still a seed.
"""

from __future__ import annotations

import functools
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
from conftest import HTML_DIR, ROOT, built_pages

HIDDEN_TAGS = {"script", "style", "noscript", "template"}
JARGON = [re.compile(r"NBVAL")] + [re.compile(p, re.IGNORECASE) for p in (  # nbval markers, in capitals
    r"\bthe seed['’]s\b",
    r"\bseeds?['’]?\s+(?:workload|example|document|text|tutorial|chapter|cheat[\s-]?sheet|table|"
    r"figure|number|version|formula|section|scenario|counting|state table)s?\b",
    r"\b(?:in|from|per|as in|of) the seed\b(?!\s*=)",
    r"\bsource documents?\b",
)]


class _Page(HTMLParser):
    """Ids, internal links and visible text of one HTML page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[str] = []
        self.text: list[str] = []
        self._hidden = 0

    def handle_starttag(self, tag, attrs) -> None:
        attributes = dict(attrs)
        for name in ("id", "name"):
            if attributes.get(name):
                self.ids.add(attributes[name])
        if tag == "a" and attributes.get("href"):
            self.links.append(attributes["href"])
        if tag in HIDDEN_TAGS:
            self._hidden += 1

    def handle_endtag(self, tag) -> None:
        if tag in HIDDEN_TAGS and self._hidden:
            self._hidden -= 1

    def handle_data(self, data) -> None:
        if not self._hidden:
            self.text.append(data)


@functools.lru_cache(maxsize=None)
def parsed(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8", errors="replace"))
    return page


def internal_target(page_path: str, href: str) -> tuple[Path, str] | None:
    """(file, anchor) an href of ``page_path`` points to inside the book, or None for outside links."""
    url = urlparse(href)
    if url.scheme or url.netloc or href.startswith(("mailto:", "javascript:")):
        return None
    base = (HTML_DIR / page_path).parent
    target = (base / unquote(url.path)).resolve() if url.path else (HTML_DIR / page_path).resolve()
    if target.is_dir():
        target = target / "index.html"
    return target, unquote(url.fragment)


def broken_links(page_path: str) -> list[str]:
    problems = []
    for href in parsed(HTML_DIR / page_path).links:
        target = internal_target(page_path, href)
        if target is None:
            continue
        path, anchor = target
        if not path.is_file():
            problems.append(f"{href}: no file {path.relative_to(HTML_DIR.parent)}")
        elif anchor and path.suffix == ".html" and anchor not in parsed(path).ids:
            problems.append(f"{href}: no id {anchor!r} on {path.relative_to(HTML_DIR)}")
    return problems


def jargon(page_path: str) -> list[str]:
    text = re.sub(r"\s+", " ", " ".join(parsed(HTML_DIR / page_path).text))
    return [text[max(m.start() - 40, 0): m.end() + 40] for p in JARGON for m in p.finditer(text)]


PAGES = built_pages()  # page_path is parametrized over these by conftest.py


def test_internal_links_land(page_path: str) -> None:
    if not PAGES:
        pytest.fail(f"no built book at {HTML_DIR}: run `make book-strict` first")
    problems = broken_links(page_path)
    assert not problems, f"{page_path}: {len(problems)} dangling links:\n" + "\n".join(problems[:30])


def test_no_build_or_source_jargon(page_path: str) -> None:
    if not PAGES:
        pytest.fail(f"no built book at {HTML_DIR}: run `make book-strict` first")
    found = jargon(page_path)
    assert not found, f"{page_path}: reader-facing text names the build or the source documents:\n" \
        + "\n".join(found)


def test_the_question_bank_links_named_sections() -> None:
    """Every "Read and run" link of the interview page goes to a section anchor, not a page top."""
    from servelab.questions import load_bank

    page = "notebooks/ch09-interview.html"
    if page not in PAGES:
        pytest.fail(f"{page} not built")
    html_text = (HTML_DIR / page).read_text(encoding="utf-8")
    links = re.findall(r'Read and run\.</strong> <a class="reference internal" href="([^"]+)"', html_text)
    assert len(links) == len(load_bank().questions), links
    assert all(re.fullmatch(r"\.\./book/ch\d\d-[\w-]+\.html#ch\d\d-[\w-]+", h) for h in links), links


def test_the_checks_catch_what_they_should(tmp_path) -> None:
    """The jargon patterns and the link resolver fail on the cases they exist for."""
    text = "the seed's full state table; on the seed workload; # NBVAL_CHECK_OUTPUT; seed example"
    assert sum(bool(p.search(text)) for p in JARGON) >= 3
    assert not any(p.search("a seeded RNG (seed = 0), the random seed 42, seeds 0..9") for p in JARGON)
    assert not any(p.search("instructors run pytest --nbval-lax") for p in JARGON)  # the tool's name is fine
    assert internal_target("book/x.html", "https://example.org/a#b") is None
    path, anchor = internal_target("book/x.html", "ch03-sampling.html#ch03-truncation")
    assert path == (HTML_DIR / "book" / "ch03-sampling.html").resolve() and anchor == "ch03-truncation"


def _heading_after(html_text: str, anchor: str) -> str | None:
    """The text of the first heading at or after the element with id ``anchor`` (tags stripped)."""
    at = re.search(rf'id="{re.escape(anchor)}"', html_text)
    heading = re.compile(r"<h[1-6][^>]*>(.*?)</h[1-6]>", re.S).search(html_text, at.start()) if at else None
    if heading is None:
        return None
    text = re.sub(r"<a class=\"headerlink\".*?</a>", "", heading.group(1), flags=re.S)
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", text)).replace("&quot;", '"').strip()
    return re.sub("[“”]", '"', text)  # Sphinx's smart quotes


def test_answer_key_numbers_and_titles_match_the_built_headings() -> None:
    """What the exported answer key prints ("§3.3 Truncation ...") is what the book shows there."""
    from servelab.questions import load_bank
    from servelab.questions.render import section_heading

    if not PAGES:
        pytest.fail(f"no built book at {HTML_DIR}: run `make book-strict` first")
    wrong = []
    for q in load_bank().questions:
        page = HTML_DIR / "book" / f"{q.chapter_slug}.html"
        shown = _heading_after(page.read_text(encoding="utf-8"), q.chapter_label)
        expected = section_heading(ROOT, q.chapter_slug, q.chapter_label)
        if shown is None or expected is None or shown != f"{expected.number}. {expected.title}":
            wrong.append(f"{q.id}: book shows {shown!r}, answer key prints {str(expected)!r}")
    assert not wrong, "\n".join(wrong)
