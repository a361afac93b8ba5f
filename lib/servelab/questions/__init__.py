"""The interview-question bank, the §9 page renderer and the assignment export for instructors.

``bank.yaml`` in this package is the single source: ``load_bank()`` validates and reads it, ``render``
turns it into the book's MyST, ``export`` writes student assignments and answer keys, ``design``
computes the design exercise's table with ``servelab.capacity``; ``reduction`` holds the split
reduction that the batch-invariance question quotes (MoE counts come from
``servelab.roofline.moe``). Command line::

    python -m servelab.questions export --tiers L1,L2 --format notebook,markdown --out DIR
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
