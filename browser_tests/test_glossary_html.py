"""Each built chapter page links the first prose use of a glossary term to that term's entry.

The terms and how the chapters write them are the source-level test's (``tests/test_glossary_links.py``,
which reads ``book/chNN-*.md``); this test reads what the reader gets, ``book/chNN-*.html``. In a
page's article, the first use of a term in prose (not in a heading, code, math, a code cell's source or
output, a glued value, an exercise or its solution, or the text of some other link) must be the text of an ``<a>`` whose href lands
on the glossary page at that term's anchor (the ``id`` of its ``<dt>``). A use inside a link to another
glossary entry is some other term's text and is passed over, as the source-level test does.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from html.parser import HTMLParser

import pytest
from conftest import HTML_DIR, ROOT, built_pages
from test_book_text import VOID_TAGS
from test_html import internal_target

PAGES = built_pages()
CHAPTER_PAGES = [p for p in PAGES if re.fullmatch(r"book/ch\d\d-[\w-]+\.html", p)]
GLOSSARY = "book/glossary.html"
NOT_PROSE_TAGS = {"h1", "h2", "h3", "h4", "h5", "h6", "code", "pre", "kbd", "samp", "script", "style", "math",
                  "svg", "noscript", "template"}
# The exercises and their solutions (the §9 question bank too) are backtick-fenced directives, which
# the source-level test does not read either: the rule is about the chapter's own prose.
NOT_PROSE_CLASSES = {"math", "cell", "cell_input", "cell_output", "output", "headerlink", "exercise", "solution"}


def _source_terms() -> dict[str, str]:
    """TERMS of the source-level test: glossary entry -> the pattern the chapters write it with."""
    spec = importlib.util.spec_from_file_location("glossary_links_source", ROOT / "tests" / "test_glossary_links.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TERMS


TERMS = _source_terms()


def _plain(text: str) -> str:
    """Sphinx's smart apostrophe, no-break space and no-break hyphen as the sources type them."""
    return text.replace("\u2019", "'").replace("\u00a0", " ").replace("\u2011", "-")


class _Article(HTMLParser):
    """The prose of a page's ``<article>`` as one string, with the href of the link around each stretch."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.text = ""
        self.links: list[tuple[int, int, str]] = []  # (start, end, href) of text inside an <a>
        self._open: list[tuple[str, bool, bool, str | None]] = []  # (tag, in article, prose, href)

    def handle_starttag(self, tag, attrs) -> None:
        self.text += " "
        if tag in VOID_TAGS:
            return
        attributes = dict(attrs)
        classes = set((attributes.get("class") or "").split())
        article, prose, href = self._open[-1][1:] if self._open else (False, True, None)
        article = article or tag == "article"
        prose = prose and tag not in NOT_PROSE_TAGS and not classes & NOT_PROSE_CLASSES \
            and not any(c.startswith("highlight") for c in classes)
        self._open.append((tag, article, prose, attributes.get("href", "") if tag == "a" else href))

    def handle_endtag(self, tag) -> None:
        self.text += " "
        for index in range(len(self._open) - 1, -1, -1):
            if self._open[index][0] == tag:
                del self._open[index:]
                break

    def handle_data(self, data) -> None:
        if not self._open or not (self._open[-1][1] and self._open[-1][2]):
            return
        data = _plain(data)
        if self._open[-1][3] is not None:
            self.links.append((len(self.text), len(self.text) + len(data), self._open[-1][3]))
        self.text += data


def article_prose(page_html: str) -> _Article:
    parser = _Article()
    parser.feed(page_html)
    return parser


class _Entries(HTMLParser):
    """The glossary page's entries: the id of each ``<dt>`` and its term (the headerlink left out)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.terms: dict[str, str] = {}
        self._dt: str | None = None
        self._headerlink = False

    def handle_starttag(self, tag, attrs) -> None:
        attributes = dict(attrs)
        if tag == "dt" and attributes.get("id"):
            self._dt = attributes["id"]
            self.terms[self._dt] = ""
        self._headerlink |= tag == "a" and "headerlink" in (attributes.get("class") or "")

    def handle_endtag(self, tag) -> None:
        if tag == "dt":
            self.terms[self._dt] = self.terms.get(self._dt, "").strip() if self._dt else ""
            self._dt = None
        if tag == "a":
            self._headerlink = False

    def handle_data(self, data) -> None:
        if self._dt and not self._headerlink:
            self.terms[self._dt] += data


@functools.lru_cache(maxsize=None)
def glossary_anchors() -> dict[str, str]:
    """Anchor id on the glossary page -> its term."""
    parser = _Entries()
    parser.feed((HTML_DIR / GLOSSARY).read_text(encoding="utf-8"))
    return {anchor: re.sub(r"\s+", " ", _plain(term)) for anchor, term in parser.terms.items()}


def first_use(page_path: str, page_html: str, term: str, pattern: str, anchors: dict[str, str]) -> str | None:
    """'linked' when the first prose use of ``term`` on the page is a link to its glossary entry, else
    the unlinked use in context; None when the page's prose does not use the term."""
    article = article_prose(page_html)
    word = re.compile(rf"(?<![\w-])(?:{pattern})(?![\w-])", re.IGNORECASE)
    glossary = (HTML_DIR / GLOSSARY).resolve()
    for match in word.finditer(article.text):
        href = next((h for start, end, h in article.links if start <= match.start() < end), None)
        if href is None:
            return re.sub(r"\s+", " ", article.text[max(match.start() - 40, 0): match.end() + 20])
        target = internal_target(page_path, href)
        if target is not None and target[0] == glossary and anchors.get(target[1], "").lower() == term.lower():
            return "linked"
    return None


def unlinked_terms(page_path: str, page_html: str, anchors: dict[str, str]) -> dict[str, str]:
    return {term: where for term, pattern in TERMS.items()
            if (where := first_use(page_path, page_html, term, pattern, anchors)) not in (None, "linked")}


def test_every_term_has_an_anchor_on_the_built_glossary() -> None:
    if GLOSSARY not in PAGES:
        pytest.fail(f"no built glossary at {HTML_DIR / GLOSSARY}: run `make book-strict` first")
    missing = set(TERMS) - set(glossary_anchors().values())
    assert not missing, f"no <dt id=...> for {sorted(missing)} on {GLOSSARY}"


@pytest.mark.parametrize("chapter", CHAPTER_PAGES or ["book/ch00-state-machine.html"])
def test_first_use_of_each_term_links_to_its_glossary_entry(chapter: str) -> None:
    if chapter not in PAGES:
        pytest.fail(f"{chapter} not built at {HTML_DIR}: run `make book-strict` first")
    unlinked = unlinked_terms(chapter, (HTML_DIR / chapter).read_text(encoding="utf-8"), glossary_anchors())
    assert not unlinked, f"{chapter}: first use not linked to the glossary: {unlinked}"


def test_the_link_check_catches_an_unlinked_first_use() -> None:
    anchors = {"term-GQA": "GQA", "term-MQA": "MQA", "term-Little-s-law": "Little's law"}
    page = "book/ch99-x.html"

    def use(body: str, term: str) -> str | None:
        return first_use(page, f"<nav><p>GQA in the sidebar</p></nav><article>{body}</article>", term,
                         TERMS[term], anchors)

    assert "plan with Little's law here" in use("<p>We plan with Little\u2019s law here.</p>", "Little's law")
    assert use('<h2>GQA</h2><p>then <a href="glossary.html#term-GQA"><span>GQA</span></a></p>', "GQA") == "linked"
    assert use('<p><code>GQA</code>, <span class="math">GQA</span>, <a href="ch04-kv-cache.html">GQA</a>; '
               '<a href="glossary.html#term-MQA">GQA</a></p>', "GQA") is None
    assert use('<p>GQA first, <a href="glossary.html#term-GQA">GQA</a> later</p>', "GQA") is not None
    assert use('<p>a link to the wrong page: <a href="other.html#term-GQA">GQA</a>, then GQA</p>', "GQA") \
        not in (None, "linked")
    assert use('<div class="cell_output"><pre>GQA</pre></div><div class="exercise admonition"><p>GQA</p></div>'
               '<p><a href="glossary.html#term-GQA">GQA</a></p>', "GQA") == "linked"


def test_the_link_check_fails_on_a_built_chapter_without_its_links() -> None:
    """A built chapter with every glossary link unwrapped fails, naming the terms it uses."""
    if not CHAPTER_PAGES:
        pytest.fail(f"no built book at {HTML_DIR}: run `make book-strict` first")
    anchors = glossary_anchors()
    for chapter in CHAPTER_PAGES:
        page_html = (HTML_DIR / chapter).read_text(encoding="utf-8")
        linked = {t for t, p in TERMS.items() if first_use(chapter, page_html, t, p, anchors) == "linked"}
        if linked:
            stripped = re.sub(r'<a class="reference internal" href="glossary\.html#[^"]*">(.*?)</a>', r"\1",
                              page_html, flags=re.S)
            assert linked <= set(unlinked_terms(chapter, stripped, anchors)), chapter
            return
    pytest.fail("no chapter links any glossary term: is the check still reading the pages?")
