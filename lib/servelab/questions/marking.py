"""Mark a free-text answer with a question's rubric: the arithmetic behind partial credit.

The marker decides two things by reading the answer: which of the rubric's key ideas it *states*
(in any words, with the formula or number where the idea has one) and which of the answer's common
mistakes it *makes*. :func:`mark` turns those two decisions into a score: the points of every idea
stated, minus ``mistake_points`` for every mistake made, never below 0. Ideas and mistakes are named
by their 0-based position in ``question.rubric.ideas`` and ``question.answer.mistakes``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from servelab._validate import require_index
from servelab.questions.bank import Question

__all__ = ["Marking", "mark", "marking_rows"]


@dataclass(frozen=True)
class Marking:
    """One answer's marks: per idea (points, idea, stated?), the mistakes made, and the score."""

    question_id: str
    ideas: tuple[tuple[int, str, bool], ...]
    mistakes: tuple[str, ...]
    mistake_points: int

    @property
    def max_points(self) -> int:
        return sum(points for points, _, _ in self.ideas)

    @property
    def idea_points(self) -> int:
        """Points for the ideas the answer states."""
        return sum(points for points, _, stated in self.ideas if stated)

    @property
    def deducted(self) -> int:
        """Points the mistakes cost (before the floor at 0)."""
        return self.mistake_points * len(self.mistakes)

    @property
    def score(self) -> int:
        return max(0, self.idea_points - self.deducted)


def _positions(name: str, values: Iterable[int], count: int) -> set[int]:
    chosen = list(values)
    picked = {require_index(f"{name}[{i}]", v, 0, count - 1) for i, v in enumerate(chosen)}
    if len(picked) != len(chosen):
        raise ValueError(f"{name} repeats a position: {chosen}")
    return picked


def mark(question: Question, ideas_stated: Iterable[int], mistakes_made: Iterable[int]) -> Marking:
    """Marks for an answer to ``question`` that states the ideas at positions ``ideas_stated`` and
    makes the common mistakes at positions ``mistakes_made`` (both 0-based, no repeats)."""
    if not isinstance(question, Question):
        raise ValueError(f"question must be a bank Question, got {type(question).__name__}")
    stated = _positions("ideas_stated", ideas_stated, len(question.rubric.ideas))
    made = _positions("mistakes_made", mistakes_made, len(question.answer.mistakes))
    return Marking(
        question_id=question.id,
        ideas=tuple((points, idea, i in stated)
                    for i, (points, idea) in enumerate(question.rubric.ideas)),
        mistakes=tuple(m for i, m in enumerate(question.answer.mistakes) if i in made),
        mistake_points=question.rubric.mistake_points,
    )


def marking_rows(marking: Marking) -> list[tuple[str, str, str]]:
    """(rubric line, verdict, points) rows for a marking table, ending with the total."""
    rows = [(idea, "stated" if stated else "not stated", f"{points if stated else 0} / {points}")
            for points, idea, stated in marking.ideas]
    rows += [(f"Mistake: {m}", "made", f"−{marking.mistake_points}") for m in marking.mistakes]
    rows.append(("Total (never below 0)", "", f"{marking.score} / {marking.max_points}"))
    return rows
