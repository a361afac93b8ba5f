"""Each chapter page links the first prose use of a glossary term to its entry.

For every term of :data:`TERMS` (all entries of ``book/glossary.md``) and every chapter page
(``book/chNN-*.md``), the first time the page uses the term in prose (not in a heading, code, math,
a link's text or a glued value) must be a ``{term}`` role, so a reader meeting the word meets its
definition one click away.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "book").glob("ch[0-9][0-9]-*.md"))
TERMS = {  # glossary entry -> how the chapters write it
    "SLO": r"SLOs?(?! attainment)", "GQA": r"GQA", "MQA": r"MQA", "RoPE": r"RoPE",
    "Block table": r"block tables?", "Copy-on-write": r"copy-on-write", "Little's law": r"Little's law",
    "All-reduce": r"all-reduces?", "Pipeline bubble": r"pipeline bubbles?", "LoRA": r"LoRA",
    "Min-p": r"min-p", "Coordinated omission": r"coordinated omission", "MFU": r"MFU",
    "Typical sampling": r"typical sampling",
}
HIDDEN = re.compile(r"(?s:```.*?```)|\{[a-z:-]+\}`[^`]*`|`[^`]*`|(?s:\$\$.*?\$\$)|\$[^$\n]*\$|"
                    r"\[[^\]]*\]\([^)]*\)|^#[^\n]*$|^\([^\n]*\)=$|^:[a-z]+:[^\n]*$", re.M)
ROLE = re.compile(r"\{term\}`([^`<]*?)\s*(?:<([^>]*)>)?`")


def first_uses(text: str, term: str, pattern: str) -> str | None:
    """'linked' when the first prose use of ``term`` is a {term} role, else the unlinked context;
    None when the page does not use the term."""
    hidden = HIDDEN.sub(lambda m: " " * len(m.group(0)) if not m.group(0).startswith("{term}") else m.group(0), text)
    word = re.compile(rf"(?<![\w-])(?:{pattern})(?![\w-])", re.IGNORECASE)
    roles = [(m.start(), m.end(), (m.group(2) or m.group(1)).strip()) for m in ROLE.finditer(hidden)]
    for m in word.finditer(hidden):
        role = next((r for r in roles if r[0] <= m.start() < r[1]), None)
        if role is None:
            return hidden[max(m.start() - 40, 0): m.end() + 20].replace("\n", " ")
        if role[2].lower() == term.lower() or word.fullmatch(role[2]):
            return "linked"
    return None


def glossary_terms() -> set[str]:
    text = (ROOT / "book" / "glossary.md").read_text(encoding="utf-8")
    block = text.split("```{glossary}", 1)[1].split("```", 1)[0]
    return {line.strip() for line in block.splitlines() if line and not line.startswith(" ")}


def test_every_listed_term_has_a_glossary_entry():
    assert set(TERMS) <= glossary_terms(), sorted(set(TERMS) - glossary_terms())


@pytest.mark.parametrize("page", CHAPTERS, ids=lambda p: p.stem)
def test_first_use_of_each_term_links_to_the_glossary(page):
    text = page.read_text(encoding="utf-8")
    unlinked = {term: where for term, pattern in TERMS.items()
                if (where := first_uses(text, term, pattern)) not in (None, "linked")}
    assert not unlinked, f"{page.name}: first use not linked: {unlinked}"


def test_the_link_check_catches_an_unlinked_first_use():
    assert first_uses("We plan with Little's law here.", "Little's law", TERMS["Little's law"]) is not None
    assert first_uses("A {term}`block table` maps blocks; a block table again.", "Block table",
                      TERMS["Block table"]) == "linked"
    assert first_uses("# GQA in a heading\n\nthen {term}`GQA` in prose", "GQA", "GQA") == "linked"
    assert first_uses("`min-p` in code and $SLO$ in math", "Min-p", TERMS["Min-p"]) is None
