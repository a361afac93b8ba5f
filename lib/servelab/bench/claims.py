"""The book's measured claims, checked against each other: one machine, honest verdicts, sane fits.

Three rules over the text a reader reads (one string per page, tags stripped):

* **one profile**: every figure a page gives for a quantity of this machine's profile (read
  bandwidth, the fp32 and bf16 matmul peaks, one empty operator's cost) names the same value on
  every page, to the precision each page prints, and the value of the build's profile when it is
  given;
* **honest verdicts**: a speed claim carries its band, as
  :meth:`servelab.bench.timing.Comparison.describe` writes it: "X× faster/slower than ... (band
  L–H×)" needs the band above 1 by more than the run-to-run resolution
  (:data:`servelab.bench.timing.RESOLUTION`), and no clause whose band stays within it says
  "faster" or "slower";
* **sane fits**: a fitted model's fixed part, written "fixed part F ms, no more than the smallest
  measured step, S ms", is no larger than that smallest measured total.

Each check returns the violations it found as sentences naming the page; an empty list is a pass.
:func:`verdicts` reads the direction of every banded claim of a page, so that two builds of the same
sources can be compared claim by claim (:func:`verdict_changes`): a second build on the same
machine must change no sentence's direction.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping

from servelab.bench.timing import beyond_resolution

NUMBER = r"(\d[\d,]*(?:\.\d+)?)"
PROFILE_PATTERNS = {
    "read bandwidth (GB/s)": re.compile(
        rf"(?:read bandwidth|this CPU's measured)[^0-9.;]{{0,30}}{NUMBER}\s*GB/s", re.IGNORECASE
    ),
    "fp32 matmul peak (GFLOP/s)": re.compile(
        rf"fp32 matmul peak[^0-9.;]{{0,30}}{NUMBER}\s*GFLOP/s", re.IGNORECASE
    ),
    "bf16 matmul peak (GFLOP/s)": re.compile(
        rf"bf16 matmul peak[^0-9.;]{{0,30}}{NUMBER}\s*GFLOP/s", re.IGNORECASE
    ),
    "one empty operator (µs)": re.compile(
        rf"(?:one empty operator[^0-9.;]{{0,30}}{NUMBER}\s*µs|{NUMBER}\s*µs for one empty "
        rf"operator)",
        re.IGNORECASE,
    ),
}
"""How a page states each profile quantity, in the units the profile's table uses."""
VERDICT = re.compile(rf"{NUMBER}× (faster|slower) than [^()]*?\(band {NUMBER}–{NUMBER}×\)")
NO_DIFFERENCE = re.compile(rf"no measurable difference \({NUMBER}×, band {NUMBER}–{NUMBER}×")
BAND = re.compile(rf"band {NUMBER}–{NUMBER}×")
SPEED_WORD = re.compile(r"\b(faster|slower)\b")
FIT = re.compile(rf"fixed part {NUMBER} ms, no more than the smallest measured step, {NUMBER} ms")
CLAUSE_END = re.compile(r"(?<=[.;:])\s+")

__all__ = [
    "PROFILE_PATTERNS",
    "fit_violations",
    "page_text",
    "profile_figures",
    "profile_violations",
    "verdict_changes",
    "verdict_violations",
    "verdicts",
]


def page_text(page_html: str) -> str:
    """What a reader reads on a page: scripts, styles and tags dropped, entities decoded, spaces
    folded."""
    text = re.sub(r"<(script|style)\b.*?</\1>", " ", page_html, flags=re.DOTALL | re.IGNORECASE)
    text = re.sub(r"<[^>]+>", " ", text)
    return re.sub(r"\s+", " ", html.unescape(text))


def _value(token: str) -> tuple[float, int]:
    """A printed number and its count of decimals ("1,234.5" -> (1234.5, 1))."""
    plain = token.replace(",", "")
    return float(plain), len(plain.split(".")[1]) if "." in plain else 0


def _band(low: str, high: str) -> tuple[float, float]:
    """A printed band's two ends as numbers."""
    return _value(low)[0], _value(high)[0]


def _agree(a: tuple[float, int], b: tuple[float, int]) -> bool:
    """Whether two printed numbers can be roundings of one value (each within its own half-unit)."""
    return abs(a[0] - b[0]) <= 0.5 * 10 ** -a[1] + 0.5 * 10 ** -b[1] + 1e-9


def profile_figures(text: str) -> dict[str, list[str]]:
    """Every figure ``text`` gives for each profile quantity, as printed."""
    found: dict[str, list[str]] = {}
    for quantity, pattern in PROFILE_PATTERNS.items():
        for match in pattern.finditer(text):
            found.setdefault(quantity, []).append(next(g for g in match.groups() if g))
    return found


def profile_violations(
    pages: Mapping[str, str], profile: Mapping[str, float] | None = None
) -> list[str]:
    """Profile quantities given two different values across ``pages`` (name -> text), or a value
    other than ``profile``'s (quantity -> value in the units of :data:`PROFILE_PATTERNS`)."""
    seen: dict[str, list[tuple[str, str]]] = {}
    for name, text in pages.items():
        for quantity, figures in profile_figures(text).items():
            seen.setdefault(quantity, []).extend((name, figure) for figure in figures)
    found = []
    for quantity, where in seen.items():
        first_page, first = where[0]
        for page, figure in where[1:]:
            if not _agree(_value(first), _value(figure)):
                found.append(f"{quantity}: {first} on {first_page} but {figure} on {page}")
        if profile and quantity in profile:
            for page, figure in where:
                printed = _value(figure)
                if not _agree(printed, (profile[quantity], 12)):
                    found.append(f"{quantity}: {figure} on {page}, the build's profile says "
                                 f"{profile[quantity]:.{printed[1]}f}")
    return found


def verdict_violations(pages: Mapping[str, str]) -> list[str]:
    """Speed words that their own band does not support."""
    found = []
    for name, text in pages.items():
        for match in VERDICT.finditer(text):
            _, word, low, high = match.groups()
            if beyond_resolution(*_band(low, high)) != "above":
                found.append(f"{name}: {word} with a band within the resolution of 1: "
                             f"{match.group(0)!r}")
        for match in NO_DIFFERENCE.finditer(text):
            if beyond_resolution(*_band(*match.groups()[1:])):
                found.append(
                    f"{name}: no difference claimed with a band beyond the resolution: "
                    f"{match.group(0)!r}"
                )
        for clause in CLAUSE_END.split(text):
            for band in BAND.finditer(clause):
                if beyond_resolution(*_band(*band.groups())) is None and SPEED_WORD.search(clause):
                    found.append(f"{name}: a ratio inside its band called "
                                 f"{SPEED_WORD.search(clause).group(0)}: {clause.strip()[:200]!r}")
    return found


def fit_violations(pages: Mapping[str, str]) -> list[str]:
    """Fitted fixed parts larger than the smallest measured total they were fitted to."""
    found = []
    for name, text in pages.items():
        for match in FIT.finditer(text):
            fixed, smallest = (_value(g)[0] for g in match.groups())
            if fixed > smallest:
                found.append(f"{name}: {match.group(0)!r}")
    return found


def _direction(clause: str, low: float, high: float) -> str:
    """A banded claim's direction: "no difference" when the band stays within the run-to-run
    resolution of 1, else the clause's speed word ("faster"/"slower"), else which side of 1 the band
    is on."""
    side = beyond_resolution(low, high)
    if side is None:
        return "no difference"
    word = SPEED_WORD.search(clause)
    return word.group(0) if word else f"{side} 1"


def verdicts(text: str) -> list[tuple[str, str]]:
    """Every band of ``text`` in page order, as ``(the clause with its numbers masked, direction)``:
    the masked clause says which claim it is, the direction what it says."""
    found = []
    for clause in CLAUSE_END.split(text):
        for band in BAND.finditer(clause):
            masked = re.sub(NUMBER, "#", SPEED_WORD.sub("~", clause.strip()))
            found.append((re.sub(r"no measurable difference", "~", masked)[:160],
                          _direction(clause, *_band(*band.groups()))))
    return found


def verdict_changes(first: Mapping[str, str], second: Mapping[str, str]) -> list[str]:
    """Claims whose direction differs between two builds of the same pages (name -> text), matched
    by page and position; a page whose banded claims differ in number is reported too."""
    found = []
    for name in sorted(first.keys() & second.keys()):
        a, b = verdicts(first[name]), verdicts(second[name])
        if len(a) != len(b):
            found.append(f"{name}: {len(a)} banded claims in the first build, {len(b)} in the "
                         "second")
            continue
        for (claim, was), (_, now) in zip(a, b):
            if was != now:
                found.append(f"{name}: {was} -> {now}: {claim!r}")
    return found
