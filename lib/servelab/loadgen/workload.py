"""Workloads for a load test: when each request is planned to arrive, and how long it is.

A workload is a list of :class:`RequestSpec`, built before the test starts and seeded, so two runs
send the same requests at the same planned instants. Arrivals are either open-loop (Poisson at a set
rate, or a recorded trace of offsets) or paced for a closed loop; lengths come from a clipped
lognormal, because real prompt and output lengths are right-skewed (many short, a few very long) and
a fixed-length test misjudges the prefill/decode mix, KV occupancy and batch composition.

System boundary: the client side only. Prompt lengths are counted in words of a fixed word list,
not in tokens, so the same workload can be sent to any OpenAI-compatible server whatever its
tokenizer; the server's ``usage.prompt_tokens`` reports the real token count. Times are seconds
relative to the start of the run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from servelab._validate import require_int, require_real

__all__ = [
    "LengthDistribution",
    "RequestSpec",
    "poisson_arrivals",
    "gamma_arrivals",
    "paced_arrivals",
    "make_prompt",
    "build_workload",
]

# Words the course model knows well (Shakespearean English); a synthetic prompt is drawn from them.
_WORDS = (
    "the and to of my you that in is not with me it for be his your this but he have as "
    "thou so will "
    "what her thy all by do no shall if are we our on thee lord good now more from sir "
    "come king love "
    "let was she how well they enter know then man there which hath would or here their when night "
    "heart upon make like speak yet such death come blood sweet fair honour grace crown "
    "sword brother "
    "father mother daughter queen duke noble gentle time world eyes hand life soul heaven fortune"
).split()


@dataclass(frozen=True)
class LengthDistribution:
    """A lognormal length (tokens or words) with a given median, clipped to [low, high].

    ``sigma`` is the standard deviation of log(length): 0 gives the fixed length ``median``; about
    0.5-1.0 matches the right skew of chat traffic. Samples are rounded to whole units.
    """

    median: float
    sigma: float
    low: int = 1
    high: int = 4096

    def __post_init__(self) -> None:
        require_real("median", self.median, 0, strict_min=True)
        require_real("sigma", self.sigma, 0)
        require_int("low", self.low, 1)
        require_int("high", self.high, self.low)
        if not self.low <= self.median <= self.high:
            raise ValueError(
                f"median must lie in [low, high] = [{self.low}, {self.high}], got {self.median}"
            )

    def sample(self, count: int, rng: np.random.Generator) -> list[int]:
        """``count`` lengths drawn with ``rng``."""
        require_int("count", count, 0)
        draws = rng.lognormal(mean=math.log(self.median), sigma=self.sigma, size=count)
        return [int(x) for x in np.clip(np.rint(draws), self.low, self.high)]


@dataclass(frozen=True)
class RequestSpec:
    """One planned request.

    ``planned_s`` is the instant (seconds after the run starts) at which the request should be sent;
    latency is measured from it. ``None`` means "as soon as a closed-loop worker is free": then no
    plan exists and latency can only be measured from the actual send.
    """

    index: int
    planned_s: float | None
    prompt: str
    max_tokens: int


def poisson_arrivals(rate: float, duration_s: float, rng: np.random.Generator) -> list[float]:
    """Arrival offsets (seconds) of a Poisson process at ``rate`` requests/s over ``duration_s``.

    Gaps are exponential with mean 1/rate, so bursts and lulls occur as in independent user traffic.
    """
    rate = require_real("rate", rate, 0, strict_min=True)
    duration_s = require_real("duration_s", duration_s, 0, strict_min=True)
    offsets: list[float] = []
    t = rng.exponential(1.0 / rate)
    while t < duration_s:
        offsets.append(float(t))
        t += rng.exponential(1.0 / rate)
    return offsets


def gamma_arrivals(
    rate: float, count: int, burstiness: float, rng: np.random.Generator
) -> list[float]:
    """``count`` arrival offsets (seconds) as ``vllm bench serve`` plans them for
    ``--request-rate``.

    Gaps are gamma-distributed with shape ``burstiness`` and mean ``1/rate``: ``burstiness`` 1 is a
    Poisson process, below 1 burstier (clumps and long lulls), above 1 more regular, ``inf`` evenly
    spaced. The first request also waits one gap. As in vLLM, the offsets are then rescaled so that
    the last one falls exactly at ``count / rate`` (the offered rate holds for every seed). A
    ``rate`` of ``inf`` sends everything at 0.
    """
    for name, value in (("rate", rate), ("burstiness", burstiness)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{name} must be a number > 0 (inf allowed), got {value!r}")
    require_int("count", count, 1)
    if math.isinf(rate):
        return [0.0] * count
    if math.isinf(burstiness):
        gaps = np.full(count, 1.0 / rate)
    else:
        gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=count)
    offsets = np.cumsum(gaps)
    return [float(t) for t in offsets * ((count / rate) / offsets[-1])]


def paced_arrivals(rate: float, count: int) -> list[float]:
    """``count`` evenly spaced offsets at ``rate`` requests/s (the schedule a paced closed loop
    keeps)."""
    rate = require_real("rate", rate, 0, strict_min=True)
    require_int("count", count, 0)
    return [i / rate for i in range(count)]


def make_prompt(num_words: int, rng: np.random.Generator) -> str:
    """A prompt of ``num_words`` words drawn with ``rng`` from a fixed Shakespearean word list."""
    require_int("num_words", num_words, 1)
    return " ".join(_WORDS[i] for i in rng.integers(0, len(_WORDS), size=num_words))


def build_workload(arrivals: Sequence[float | None], prompt_words: LengthDistribution,
                   output_tokens: LengthDistribution, seed: int) -> list[RequestSpec]:
    """One :class:`RequestSpec` per arrival offset, with seeded prompt and output lengths.

    ``arrivals`` are offsets in seconds (non-decreasing) or ``None`` entries for an unpaced closed
    loop. ``output_tokens`` becomes each request's ``max_tokens`` (send ``ignore_eos`` to make the
    server generate exactly that many).
    """
    if not isinstance(prompt_words, LengthDistribution) or not isinstance(
        output_tokens, LengthDistribution
    ):
        raise TypeError("prompt_words and output_tokens must be LengthDistribution")
    require_int("seed", seed, 0)
    arrivals = list(arrivals)
    planned = [a for a in arrivals if a is not None]
    if planned and len(planned) != len(arrivals):
        raise ValueError("arrivals must be all offsets or all None, not a mix")
    for a in planned:
        require_real("arrivals[i]", a, 0)
    if any(b < a for a, b in zip(planned, planned[1:])):
        raise ValueError("arrivals must be non-decreasing")
    rng = np.random.default_rng(seed)
    words = prompt_words.sample(len(arrivals), rng)
    outs = output_tokens.sample(len(arrivals), rng)
    return [RequestSpec(i, None if a is None else float(a), make_prompt(w, rng), o)
            for i, (a, w, o) in enumerate(zip(arrivals, words, outs))]
