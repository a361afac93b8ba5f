"""§9, the interview-question bank, the page renderer and the design exercise.

``bank.yaml`` in this package is the single source: ``load_bank()`` validates and reads it,
``render`` turns it into the book's MyST, ``design`` computes the design exercise's table with
``servelab.metrics.capacity``; ``reduction`` holds the split reduction that the batch-invariance
question quotes (MoE counts come from ``servelab.metrics.roofline.moe``). Assignments and answer
keys are written by the instructor-only ``python -m servelab_instructor.questions export ...``,
which is not in the wheel.
"""

from servelab.questions.bank import (
    CHAPTER_SLUGS,
    CORE_IDS,
    Answer,
    Bank,
    BankError,
    DesignExercise,
    Question,
    Tier,
    load_bank,
    resolve_code_link,
)

__all__ = [
    "CHAPTER_SLUGS",
    "CORE_IDS",
    "Answer",
    "Bank",
    "BankError",
    "DesignExercise",
    "Question",
    "Tier",
    "load_bank",
    "resolve_code_link",
]
