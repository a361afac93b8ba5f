"""Static checks of the built book's wording (no browser): one reservation rule, data as prose.

Reservation rule: every clause of the book that says what a KV reservation covers (the uncached
prompt, the prompt plus max_tokens, a predicted output) is read with the policy it names, and
whether it claims the output is reserved must match that policy's behaviour in
``servelab.engine.scheduler`` (the default policy when it names none but says "default"). Two
pages that state the rule differently cannot both pass. The state diagram's hover text is read too.

Data as words: nothing a reader reads on any page may show a Python boolean ("True", "False") or a
hedged plural ("token(s)"). That is the prose, the notebooks' outputs (printed text, HTML tables,
glued values) and the text of every figure: titles, axis and tick labels, legend names, slider labels,
annotations and hover text, read from the plotly specs the page carries. Code is not read: inline
``<code>``, math, code blocks and the source of code cells (shown on notebook pages); a ``<pre>``
inside a cell's output is output, and is read.
"""

from __future__ import annotations

import html as html_lib
import json
import re
from html.parser import HTMLParser

import pytest
from conftest import HTML_DIR, built_pages

PAGES = built_pages()
PROSE_TAGS = {"p", "li", "dd", "dt", "h1", "h2", "h3", "h4", "h5", "h6", "figcaption", "caption"}
CODE_TAGS = {"code", "pre", "script", "style", "kbd", "samp", "table"}
HIDDEN_TAGS = {"pre", "script", "style"}
BOOLEAN = re.compile(r"\b(True|False)\b")
HEDGED_PLURAL = re.compile(r"\w\(s\)")
COVERS = re.compile(r"uncached prompt|prompt plus|prompt miss|predicted output", re.IGNORECASE)
WITH_OUTPUT = re.compile(r"predicted output|max_tokens|output too|and (?:the )?output", re.IGNORECASE)
POLICY = re.compile(r"on-demand|up-front", re.IGNORECASE)


class _Prose(HTMLParser):
    """The text of prose elements, outside code and tables, one string per element."""

    def __init__(self, skipped: set[str]) -> None:
        super().__init__(convert_charrefs=True)
        self.skipped = skipped
        self.blocks: list[str] = []
        self._open: list[str] = []
        self._code = 0

    def handle_starttag(self, tag, attrs) -> None:
        if tag in self.skipped:
            self._code += 1
        if tag in PROSE_TAGS:
            self._open.append(tag)
            self.blocks.append("")

    def handle_endtag(self, tag) -> None:
        if tag in self.skipped and self._code:
            self._code -= 1
        if tag in PROSE_TAGS and self._open:
            self._open.pop()

    def handle_data(self, data) -> None:
        if self._open and not self._code:
            self.blocks[-1] += data


def prose_blocks(page_html: str, skipped: set[str] = CODE_TAGS) -> list[str]:
    """Text of each prose element; inline code is kept when ``skipped`` does not name it."""
    parser = _Prose(skipped)
    parser.feed(page_html)
    return [re.sub(r"\s+", " ", b).strip() for b in parser.blocks if b.strip()]


VOID_TAGS = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source",
             "track", "wbr"}
CODE_ELEMENTS = {"code", "kbd", "samp", "script", "style", "noscript", "template", "svg", "math", "textarea"}
CODE_CLASSES = {"cell_input", "math", "traceback"}  # a code cell's source, TeX, a Python traceback
OUTPUT_CLASSES = {"cell_output", "output"}  # a code cell's output, or a glued value
FIGURE_TEXT = re.compile(r'"(text|hovertext|ticktext|name|label|title|hovertemplate|texttemplate|prefix|suffix)":\s*')


class _ReaderText(HTMLParser):
    """What a reader reads on a page (code left out, outputs kept) and the page's script texts."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.scripts: list[str] = []
        self._open: list[tuple[str, bool, bool]] = []  # (tag, code, inside an output)

    def handle_starttag(self, tag, attrs) -> None:
        self.parts.append(" ")
        if tag in VOID_TAGS:
            return
        classes = set((dict(attrs).get("class") or "").split())
        code, output = self._open[-1][1:] if self._open else (False, False)
        output = output or bool(classes & OUTPUT_CLASSES)
        code = code or tag in CODE_ELEMENTS or bool(classes & CODE_CLASSES) or (
            not output and (tag == "pre" or any(c.startswith("highlight") for c in classes)))
        self._open.append((tag, code, output))
        if tag == "script":
            self.scripts.append("")

    def handle_endtag(self, tag) -> None:
        self.parts.append(" ")
        for index in range(len(self._open) - 1, -1, -1):
            if self._open[index][0] == tag:
                del self._open[index:]
                break

    def handle_data(self, data) -> None:
        if self._open and self._open[-1][0] == "script":
            self.scripts[-1] += data
        elif not (self._open and self._open[-1][1]):
            self.parts.append(data)


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [s for v in value.values() for s in _strings(v)] if isinstance(value, dict) else []


def figure_texts(page_html: str, scripts: list[str] | None = None) -> list[str]:
    """Every text a figure draws, from the JSON specs in the page's scripts: titles, axis titles, tick
    labels, trace and frame names, slider labels, annotations, hover texts and templates; tags stripped."""
    if scripts is None:
        parser = _ReaderText()
        parser.feed(page_html)
        scripts = parser.scripts
    decoder, texts = json.JSONDecoder(), []
    for script in scripts:
        read_to = 0
        for key in FIGURE_TEXT.finditer(script):
            if key.start() < read_to:
                continue  # inside a value already read ("title": {"text": ...})
            try:
                value, read_to = decoder.raw_decode(script, key.end())
            except json.JSONDecodeError:
                continue  # JavaScript, not a spec
            texts += _strings(value)
    return [re.sub(r"\s+", " ", html_lib.unescape(re.sub(r"<[^>]+>", " ", t))).strip() for t in texts]


def reader_texts(page_html: str) -> list[str]:
    """The page's reader-facing text in one string, then each figure text."""
    parser = _ReaderText()
    parser.feed(page_html)
    return [re.sub(r"\s+", " ", "".join(parser.parts)), *figure_texts(page_html, parser.scripts)]


def prose_problems(page_html: str) -> list[str]:
    found = []
    for block in reader_texts(page_html):
        for pattern in (BOOLEAN, HEDGED_PLURAL):
            found += [block[max(m.start() - 50, 0): m.end() + 30] for m in pattern.finditer(block)]
    return found


def _clauses(text: str) -> list[str]:
    sentences = re.split(r"(?<=[.;])\s+|\s+[–—]\s+", text)
    return [c for s in sentences for c in re.split(r"[;,(]\s*(?=[^)]*(?:on-demand|up-front|default))", s)]


def reservation_claims(text: str) -> list[tuple[str, bool, str]]:
    """(policy or "default", whether the output is said to be reserved, clause) for each clause of
    ``text`` that says what a reservation covers and names one policy or the default."""
    claims = []
    for clause in _clauses(text):
        if not COVERS.search(clause):
            continue
        named = {m.group(0).lower() for m in POLICY.finditer(clause)}
        if len(named) == 1:
            policy = named.pop()
        elif not named and re.search(r"\bdefault\b|guard|QUEUED", clause):
            policy = "default"
        else:
            continue
        claims.append((policy, bool(WITH_OUTPUT.search(clause)), clause.strip()))
    return claims


def expected_covers_output() -> dict[str, bool]:
    """Whether each policy (and the default) reserves output blocks, from the engine's behaviour."""
    from servelab.engine.config import RESERVATION_POLICIES
    from servelab.engine.admission import reservation_policy
    from servelab.lifecycle.reservation_rules import default_policy

    covers = {p: reservation_policy(p, block_size=16).output_blocks(20, 40, samples=1) > 0
              for p in RESERVATION_POLICIES}
    return {**covers, "default": covers[default_policy()]}


def rule_conflicts(pages: dict[str, str]) -> list[str]:
    expected = expected_covers_output()
    wrong = []
    for name, page_html in pages.items():
        texts = prose_blocks(page_html, HIDDEN_TAGS) + figure_texts(page_html)
        texts += [re.sub(r"\s+", " ", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", page_html, re.S)]
        for policy, covers, clause in (c for t in texts for c in reservation_claims(t)):
            if covers != expected[policy]:
                said = "reserves the output" if covers else "reserves only the prompt"
                wrong.append(f"{name}: says {policy!r} {said}: {clause[:160]!r}")
    return wrong


def test_one_reservation_rule_across_the_book() -> None:
    if not PAGES:
        pytest.fail(f"no built book at {HTML_DIR}: run `make book-strict` first")
    pages = {p: (HTML_DIR / p).read_text(encoding="utf-8", errors="replace") for p in PAGES}
    conflicts = rule_conflicts(pages)
    assert not conflicts, "\n".join(conflicts)
    claims = sum(len(reservation_claims(t)) for h in pages.values() for t in prose_blocks(h, HIDDEN_TAGS))
    assert claims >= 5, f"only {claims} reservation statements found: is the checker still reading the pages?"


def test_prose_shows_no_booleans_or_hedged_plurals(page_path: str) -> None:
    if not PAGES:
        pytest.fail(f"no built book at {HTML_DIR}: run `make book-strict` first")
    found = prose_problems((HTML_DIR / page_path).read_text(encoding="utf-8", errors="replace"))
    assert not found, f"{page_path}: data shown as code in what a reader reads:\n" + "\n".join(found[:20])


def test_the_text_checks_catch_what_they_should() -> None:
    bad = ('<p>identity holds: True; keeps 1 token(s)</p><pre>True</pre>'
           '<p>a request in <code>False</code> state</p>')
    assert len(prose_problems(bad)) == 2
    outputs = ('<div class="cell docutils container"><div class="cell_input docutils container">'
               '<div class="highlight-ipython3 notranslate"><div class="highlight"><pre>ok = True</pre></div></div></div>'
               '<div class="cell_output docutils container"><div class="output stream highlight-myst-ansi notranslate">'
               '<div class="highlight"><pre>cache == recompute: False</pre></div></div>'
               '<div class="output text_html"><table><tr><th>t (s)</th><td>True</td><td>2 block(s)</td></tr></table>'
               '</div></div></div>'
               '<div class="highlight-python notranslate"><div class="highlight"><pre>x = False</pre></div></div>'
               '<p>the rate <span class="math notranslate nohighlight">\\(r(s)\\)</span>, <em>yes</em><br>True</p>')
    found = prose_problems(outputs)  # the output's False, the table's True and block(s), the prose's True
    assert len(found) == 4 and not any(code in f for f in found for code in ("ok =", "x =", "r(s)")), found
    figure = ('<div class="output text_html"><script>var spec = {"data":[{"name":"decode token(s)","x":[1,2]}],'
              '"layout":{"xaxis":{"ticktext":["no","True"],"title":{"text":"ticks<br>(per request)"}}}};'
              'function draw(s) { return s.True; }</script></div>')
    assert figure_texts(figure) == ["decode token(s)", "no", "True", "ticks (per request)"]
    assert len(prose_problems(figure)) == 2
    two_rules = {
        "a.html": '<p>The default <code>"on-demand"</code> reserves the blocks of the uncached prompt only.</p>',
        "b.html": '<td>QUEUED</td><td>guard: a KV reservation for prompt miss + predicted output succeeded</td>',
        "c.html": '<li>under <code>"up-front"</code> admission reserves the uncached prompt blocks.</li>',
    }
    conflicts = rule_conflicts(two_rules)
    assert any(c.startswith("b.html") for c in conflicts) and any(c.startswith("c.html") for c in conflicts)
    assert not any(c.startswith("a.html") for c in conflicts), conflicts
