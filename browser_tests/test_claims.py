"""The built book states one truth (no browser): the rules of ``servelab.bench.claims`` on the book
this stage serves, which ``make book-strict`` executed and built in this run, against the machine
profile that build measured.

One profile value per quantity on every page, no speed word on a ratio inside its band, no fitted
fixed part above the smallest measured step. ``tests/test_book_claims.py`` checks each rule on crafted
pages and on the committed sources; this is the same check on the build itself.
"""

from __future__ import annotations

import importlib.util
import sys

from conftest import HTML_DIR, ROOT
from servelab.bench.claims import fit_violations, profile_violations, verdict_violations, verdicts

_spec = importlib.util.spec_from_file_location("book_pages", ROOT / "tools" / "book_pages.py")
book_pages = importlib.util.module_from_spec(_spec)
sys.modules["book_pages"] = book_pages
_spec.loader.exec_module(book_pages)


def test_built_book_states_one_truth():
    pages = book_pages.built_pages(HTML_DIR)
    assert sum(len(verdicts(text)) for text in pages.values()) >= 5, "no banded claims read"
    found = (profile_violations(pages, book_pages.profile_values(HTML_DIR.parent / "machine-profile.json")) + verdict_violations(pages)
             + fit_violations(pages))
    assert found == [], "\n".join(found)
