"""The course's timing discipline: A against B, interleaved, with a noise band and an honest
verdict.

On a shared machine one timing means little: another process, a frequency change or the allocator
growing can move it by tens of percent. So every speed claim in the course is a comparison made
here:

* **warm-up excluded**: each side runs ``warmup`` times first (lazy imports, allocator growth,
  caches); those calls are not timed. A cold start is a phase of its own and is measured as one
  elsewhere;
* **interleaved**: repetition ``i`` of A and of B run back to back (the order alternates), so a
  burst of other load hits both sides of a pair;
* **paired ratios**: each pair gives ``t_A / t_B`` (above 1: B took less time). The reported ratio
  is their median, and the band is a seeded bootstrap interval of that median (95 % by default);
* **verdict**: "faster" or "slower" only when the whole band is on one side of 1 by more than
  :data:`RESOLUTION`, the drift between two runs of the same comparison on this kind of machine;
  otherwise "no measurable difference". Prose reads the verdict from here, never from the ratio
  alone.

System boundary: this process, wall-clock seconds (:func:`time.perf_counter`) unless a clock is
given.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

NO_DIFFERENCE = "no measurable difference"
RESOLUTION = 0.15
"""The smallest difference a verdict names: a band must clear 1 by 15 %. A band is the noise within
one run; between two runs the machine itself changes (other tenants, memory placement, frequency),
and on the 2-core shared VM (AMD EPYC) that builds this book the same comparisons moved by up to
12 % between two builds, each with a narrow band: int8 weights on the tiny model 0.99x then 0.90x,
the 64 MiB pool against ``generate`` 1.11x then 1.01x, n-gram speculation without a KV cache 1.13x
then 1.08x. A verdict inside that drift would change direction from one build to the next."""


@dataclass(frozen=True)
class Timing:
    """One side's timed repeats in seconds: the median and the interquartile range."""

    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def quartiles(self) -> tuple[float, float]:
        """(25th, 75th) percentile in seconds."""
        q1, _, q3 = statistics.quantiles(self.samples, n=4, method="inclusive")
        return q1, q3


def _clears(value: float, bound: float = 1.0 + RESOLUTION) -> bool:
    """Whether ``value`` printed with two decimals reads above ``bound``."""
    return float(f"{value:.2f}") > bound + 1e-9


def beyond_resolution(low: float, high: float) -> str | None:
    """Which side of 1 a band ``low``-``high`` (ratios as printed, two decimals) is on by more than
    :data:`RESOLUTION`: "above", "below" or None."""
    if _clears(low):
        return "above"
    if _clears(1 / high) and float(f"{high:.2f}") < 1.0:  # both ways it is printed
        return "below"
    return None


@dataclass(frozen=True)
class Comparison:
    """A against B: paired ratios ``t_A / t_B`` with their median and a bootstrap band."""

    a: Timing
    b: Timing
    ratio: float
    band: tuple[float, float]

    @property
    def verdict(self) -> str:
        """B compared with A: "faster", "slower" or "no measurable difference": the band must clear
        1 by more than :data:`RESOLUTION` as the book prints it (two decimals), so a band that reads
        "1.00–1.06×" or "1.08–1.12×" is no difference."""
        side = beyond_resolution(*self.band)
        return {"above": "faster", "below": "slower", None: NO_DIFFERENCE}[side]

    def no_difference_text(self) -> str:
        """The phrase for a ratio inside the drift: "no measurable difference (1.08×, band
        1.08–1.12×, ...)", and where the band leaves 1 but not by :data:`RESOLUTION`, that it is
        inside the drift."""
        low, high = self.band
        drift = "" if low <= 1.0 <= high else (
            f", inside the {RESOLUTION * 100:.0f} % this machine drifts between runs")
        return f"{NO_DIFFERENCE} ({self.ratio:.2f}×, band {low:.2f}–{high:.2f}×{drift})"

    def describe(self, a_name: str, b_name: str) -> str:
        """One phrase for the prose, e.g. "B is 1.52× faster than A (band 1.45–1.60×)": the factor
        and its band both as "times faster" or both as "times slower" (above 1); inside the band, "B
        vs A: no measurable difference (0.98×, band 0.93–1.04×)" with t_A / t_B; a band that leaves
        1 but not by :data:`RESOLUTION` says so. The band in parentheses is the marker the book's
        checks read."""
        low, high = self.band
        if self.verdict == NO_DIFFERENCE:
            return f"{b_name} vs {a_name}: {self.no_difference_text()}"
        if self.verdict == "slower":  # the factor and its band as "times slower", both above 1
            return (f"{b_name} is {1 / self.ratio:.2f}× slower than {a_name} "
                    f"(band {1 / high:.2f}–{1 / low:.2f}×)")
        return f"{b_name} is {self.ratio:.2f}× faster than {a_name} (band {low:.2f}–{high:.2f}×)"


def bootstrap_median_band(values: list[float], confidence: float = 0.95, resamples: int = 2000,
                          seed: int = 0) -> tuple[float, float]:
    """A seeded percentile-bootstrap interval of the median of ``values``."""
    if not values:
        raise ValueError("values must hold at least one number")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values)))
                     for _ in range(resamples))
    tail = (1.0 - confidence) / 2
    return medians[int(tail * (resamples - 1))], medians[int((1 - tail) * (resamples - 1))]


def compare_ratios(a: list[float], b: list[float], confidence: float = 0.95) -> Comparison:
    """The comparison of paired timings ``a[i]``, ``b[i]`` (seconds, measured interleaved)."""
    if len(a) != len(b) or len(a) < 3:
        raise ValueError(
            f"a and b must be paired and hold at least 3 repeats, got {len(a)} and {len(b)}"
        )
    if min(a) <= 0 or min(b) <= 0:
        raise ValueError("timings must be positive seconds")
    ratios = [ta / tb for ta, tb in zip(a, b)]
    return Comparison(Timing(tuple(a)), Timing(tuple(b)), statistics.median(ratios),
                      bootstrap_median_band(ratios, confidence))


def rotated_rounds(names: list[str], repeats: int) -> Iterator[str]:
    """The order of ``repeats`` interleaved rounds: every name once per round, the order rotated by
    one each round, so that no run always follows the same other run."""
    for i in range(repeats):
        shift = i % len(names)
        yield from names[shift:] + names[:shift]


def time_interleaved(runs: dict[str, Callable[[], object]], repeats: int = 7, warmup: int = 1,
                     clock: Callable[[], float] = time.perf_counter) -> dict[str, list[float]]:
    """Seconds of each of several runs, ``repeats`` rounds after ``warmup`` untimed calls each.

    Every round runs each once, the order rotated by one per round, so that any two of them are
    measured side by side: :func:`compare_ratios` then pairs their lists round by round."""
    if repeats < 3:
        raise ValueError(f"repeats must be at least 3, got {repeats}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    if not runs:
        raise ValueError("runs must name at least one function")
    names = list(runs)
    for _ in range(warmup):
        for name in names:
            runs[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for name in rotated_rounds(names, repeats):
        start = clock()
        runs[name]()
        times[name].append(clock() - start)
    return times


def compare(run_a: Callable[[], object], run_b: Callable[[], object], repeats: int = 15,
            warmup: int = 1, clock: Callable[[], float] = time.perf_counter) -> Comparison:
    """Time ``run_a`` and ``run_b`` interleaved, ``repeats`` pairs after ``warmup`` untimed calls
    each.

    The order within a pair alternates (AB, BA, AB, ...), so neither side always runs second."""
    if repeats < 3:
        raise ValueError(f"repeats must be at least 3, got {repeats}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    for _ in range(warmup):
        run_a()
        run_b()
    a: list[float] = []
    b: list[float] = []
    for i in range(repeats):
        order = ((run_a, a), (run_b, b)) if i % 2 == 0 else ((run_b, b), (run_a, a))
        for run, times in order:
            start = clock()
            run()
            times.append(clock() - start)
    return compare_ratios(a, b)
