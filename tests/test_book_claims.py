"""The built book's measured claims: one machine profile, verdicts inside their bands, sane fits.

The rules (:mod:`servelab.bench.claims`) are checked on crafted pages that break each one; on the
committed sources (every chapter with its glued values filled in from the committed notebooks, and
every notebook's printed outputs) against the profile those notebooks ran with
(``notebooks/machine-profile.json``). The built book is checked after ``make book-strict``, by
``browser_tests/test_claims.py``; two runs' claims are compared by ``tools/book_pages.py``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from servelab.bench.claims import (
    fit_violations,
    page_text,
    profile_figures,
    profile_violations,
    verdict_changes,
    verdict_violations,
    verdicts,
)
from servelab.bench.timing import compare_ratios

ROOT = Path(__file__).resolve().parent.parent
COMMITTED_PROFILE = ROOT / "notebooks" / "machine-profile.json"
_spec = importlib.util.spec_from_file_location("book_pages", ROOT / "tools" / "book_pages.py")
book_pages = importlib.util.module_from_spec(_spec)
sys.modules["book_pages"] = book_pages
_spec.loader.exec_module(book_pages)


def test_page_text_reads_tables_and_skips_scripts():
    text = page_text("<p>Read <b>bandwidth</b></p><script>var x = '99 GB/s';</script>"
                     "<table><tr><td>read bandwidth</td><td>20.8&nbsp;GB/s</td></tr></table>")
    assert "99" not in text
    assert profile_figures(text) == {"read bandwidth (GB/s)": ["20.8"]}


def test_one_value_per_quantity_across_pages():
    same = {"ch02": "read bandwidth 20.8 GB/s, fp32 matmul peak 102.2 GFLOP/s",
            "ch07": "at this CPU's measured 20.8 GB/s takes 26 ms; one empty operator: 2.39 µs",
            "machine": "read bandwidth 20.8 GB/s fp32 matmul peak 102 GFLOP/s 2.4 µs for one empty operator"}
    assert profile_violations(same) == []
    broken = same | {"ch05": "its read bandwidth was 12.6 GB/s"}
    found = profile_violations(broken)
    assert len(found) == 1 and "12.6 on ch05" in found[0]


def test_every_page_agrees_with_the_builds_profile():
    pages = {"ch02": "read bandwidth 20.8 GB/s", "ch07": "read bandwidth 20.8 GB/s"}
    assert profile_violations(pages, {"read bandwidth (GB/s)": 20.77}) == []
    found = profile_violations(pages, {"read bandwidth (GB/s)": 40.6})
    assert len(found) == 2 and "profile says 40.6" in found[0]


def test_describe_passes_and_a_word_inside_the_band_fails():
    clear = compare_ratios([2.0, 2.1, 1.9, 2.0, 2.05], [1.0, 1.0, 1.02, 0.98, 1.0])
    slow = compare_ratios([1.0] * 5, [1.5, 1.6, 1.4, 1.5, 1.55])
    noise = compare_ratios([1.0, 1.2, 0.9, 1.1, 1.0, 0.95], [1.1, 0.9, 1.05, 1.0, 1.2, 0.92])
    page = "; ".join(c.describe("fp32", "int8") for c in (clear, slow, noise)) + "."
    assert verdict_violations({"ch07": page}) == []
    crafted = {
        "inside": "KV cache + int8 is 1.02× faster than KV cache (band 0.97–1.08×).",
        "word in clause": "int8 was faster (1.02×, band 0.97–1.08×) on this build.",
        "no difference outside": "int8 vs fp32: no measurable difference (1.30×, band 1.20–1.40×).",
    }
    found = verdict_violations(crafted)
    assert {f.split(":")[0] for f in found} == set(crafted)


def test_a_claim_that_changes_direction_between_builds_is_reported():
    first = {"ch05": "per-step vs on-demand: no measurable difference (1.04×, band 0.93–1.15×); "
                     "int8 is 1.30× faster than fp32 (band 1.20–1.40×).",
             "ch07": "the int8 pair is 1.25× slower than plain decoding (band 1.10–1.40×)."}
    same = {"ch05": "per-step vs on-demand: no measurable difference (0.97×, band 0.90–1.08×); "
                    "int8 is 1.41× faster than fp32 (band 1.33–1.52×).",
            "ch07": "the int8 pair is 1.19× slower than plain decoding (band 1.05–1.31×)."}
    assert [d for _, d in verdicts(first["ch05"])] == ["no difference", "faster"]
    assert verdict_changes(first, same) == []
    flipped = same | {"ch05": "per-step is 1.26× faster than on-demand (band 1.20–1.32×); "
                              "int8 is 1.41× faster than fp32 (band 1.33–1.52×)."}
    found = verdict_changes(first, flipped)
    assert len(found) == 1 and "no difference -> faster" in found[0]
    fewer = same | {"ch07": "the int8 pair ran."}
    assert "1 banded claims in the first build, 0 in the second" in verdict_changes(first, fewer)[0]


def test_fit_fixed_part_above_smallest_step_fails():
    good = "Its fit (fixed part 30.10 ms, no more than the smallest measured step, 31.00 ms) ..."
    bad = "Its fit (fixed part 143.9 ms, no more than the smallest measured step, 99.8 ms) ..."
    assert fit_violations({"ok": good}) == []
    assert len(fit_violations({"ch07": bad})) == 1


def test_committed_sources_state_one_truth():
    pages = book_pages.source_pages(ROOT / "notebooks")
    profile = book_pages.profile_values(COMMITTED_PROFILE)
    found = profile_violations(pages, profile) + verdict_violations(pages) + fit_violations(pages)
    assert found == [], "\n".join(found)
