"""Load and validate the interview-question bank (``bank.yaml``), the single source of §9.

``load_bank()`` reads the YAML file shipped in this package, checks it against ``schema.json`` and
against the rules a JSON schema cannot express (unique ids, known tiers and sets, the complete
Q1-Q25 core set, known chapter slugs), and returns frozen dataclasses. Nothing else in the course
reads the YAML directly: the book page, the assignment export and the tests all go through this
module.
"""

from __future__ import annotations

import importlib
import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "CHAPTER_SLUGS",
    "CORE_IDS",
    "Answer",
    "Bank",
    "BankError",
    "DesignExercise",
    "Question",
    "Rubric",
    "Tier",
    "load_bank",
    "load_raw",
    "resolve_code_link",
    "validate_raw",
]

CHAPTER_SLUGS = (
    "ch00-state-machine",
    "ch01-request-lifecycle",
    "ch02-metrics",
    "ch02-capacity",
    "ch03-sampling",
    "ch04-kv-cache",
    "ch05-scheduling",
    "ch06-cluster",
    "ch07-combining",
    "ch07-production",
    "ch08-from-scratch",
    "ch09-interview",
    "appendix-a-checks",
)
"""The book's page slugs (``book/<slug>.md``); every chapter link must name one of them."""

CORE_SET = "core"
CORE_IDS = tuple(f"Q{i}" for i in range(1, 26))
"""The §9 core set: exactly these 25 ids."""


class BankError(ValueError):
    """The bank file breaks the schema or a cross-field rule; the message lists every problem."""


@dataclass(frozen=True)
class Tier:
    """A difficulty tier: ``L1`` must-know, ``L2`` advanced, ``L3`` top-lab."""

    id: str
    title: str
    blurb: str


@dataclass(frozen=True)
class Answer:
    """The three parts every answer has: how to frame it, the key formula/definition, common
    mistakes."""

    framework: str
    key: str
    mistakes: tuple[str, ...]

    def texts(self) -> tuple[str, ...]:
        """Every piece of answer text, for checks that no answer leaked into a student file."""
        return (self.framework, self.key, *self.mistakes)


@dataclass(frozen=True)
class Rubric:
    """How to mark a free-text answer: points per key idea present, minus ``mistake_points`` for
    each of the answer's common mistakes the text makes (never below 0)."""

    ideas: tuple[tuple[int, str], ...]
    mistake_points: int

    @property
    def max_points(self) -> int:
        return sum(points for points, _ in self.ideas)


@dataclass(frozen=True)
class Question:
    """One interview question with its answer and its two links.

    ``chapter`` is ``"<book slug>#<MyST label>"`` (the section that teaches it); ``code`` is the
    dotted name of the ``servelab`` object that computes or demonstrates it.
    """

    id: str
    set: str
    tier: str
    title: str
    question: str
    answer: Answer
    chapter: str
    code: str
    rubric: Rubric

    @property
    def chapter_slug(self) -> str:
        """The book page part of the chapter link, e.g. ``"ch03-sampling"``."""
        return self.chapter.split("#", 1)[0]

    @property
    def chapter_label(self) -> str:
        """The MyST label part of the chapter link, e.g. ``"ch03-top-p"``."""
        return self.chapter.split("#", 1)[1]


@dataclass(frozen=True)
class DesignExercise:
    """An open design exercise: requirements and the points a strong answer covers."""

    id: str
    set: str
    title: str
    prompt: str
    functional: tuple[str, ...]
    non_functional: tuple[str, ...]
    model_answer: tuple[str, ...]


@dataclass(frozen=True)
class Bank:
    """The validated bank: tiers and sets in file order, questions in file order."""

    tiers: tuple[Tier, ...]
    sets: dict[str, str]
    questions: tuple[Question, ...]
    design_exercises: tuple[DesignExercise, ...]

    def question(self, question_id: str) -> Question:
        """The question with id ``question_id``; raises KeyError naming it when there is none."""
        for q in self.questions:
            if q.id == question_id:
                return q
        raise KeyError(f"question_id {question_id!r} is not in the bank")

    def tier(self, tier_id: str) -> Tier:
        """The tier with id ``tier_id``; raises KeyError naming it when there is none."""
        for t in self.tiers:
            if t.id == tier_id:
                return t
        raise KeyError(
            f"tier_id {tier_id!r} is not in the bank (known: {[t.id for t in self.tiers]})"
        )

    def select(
        self,
        tiers: list[str] | None = None,
        ids: list[str] | None = None,
        set_id: str | None = CORE_SET,
    ) -> list[Question]:
        """Questions chosen by tier or by id, in bank order.

        ``ids`` (when given) picks exactly those questions from any set, and each must exist.
        Otherwise ``tiers`` (default: all) filters the questions of ``set_id`` (``None``: every
        set).
        """
        if ids is not None:
            return _select_ids(self, ids)
        known_tiers = [t.id for t in self.tiers]
        chosen_tiers = known_tiers if tiers is None else list(tiers)
        unknown = [t for t in chosen_tiers if t not in known_tiers]
        if unknown or not chosen_tiers:
            raise ValueError(
                f"tiers must be a non-empty subset of {known_tiers}, got {chosen_tiers}"
            )
        if set_id is not None and set_id not in self.sets:
            raise ValueError(f"set_id must be one of {sorted(self.sets)} or None, got {set_id!r}")
        return [
            q for q in self.questions
            if q.tier in chosen_tiers and (set_id is None or q.set == set_id)
        ]


def _select_ids(bank: Bank, ids: list[str]) -> list[Question]:
    """Questions with the given ids, in bank order; ValueError naming any unknown or repeated id."""
    wanted = list(ids)
    if not wanted:
        raise ValueError("ids must name at least one question")
    known = {q.id for q in bank.questions}
    unknown = [i for i in wanted if i not in known]
    if unknown:
        raise ValueError(f"ids contains unknown question ids: {unknown}")
    if len(set(wanted)) != len(wanted):
        raise ValueError(f"ids repeats a question id: {wanted}")
    return [q for q in bank.questions if q.id in wanted]


def _package_file(name: str) -> Path:
    return Path(str(resources.files("servelab.questions").joinpath(name)))


def load_raw(path: str | Path | None = None) -> dict[str, Any]:
    """The bank as plain data (dicts and lists), read from ``path`` or the packaged
    ``bank.yaml``."""
    source = _package_file("bank.yaml") if path is None else Path(path)
    with source.open(encoding="utf-8") as handle:
        data = yaml.safe_load(handle)
    if not isinstance(data, dict):
        raise BankError(f"{source} must hold a YAML mapping at the top level")
    return data


def _schema_problems(data: dict[str, Any]) -> list[str]:
    import jsonschema  # ships with Jupyter (nbformat depends on it)

    schema = json.loads(_package_file("schema.json").read_text(encoding="utf-8"))
    validator = jsonschema.Draft202012Validator(schema)
    return [
        f"{'/'.join(map(str, err.absolute_path)) or '<root>'}: {err.message}"
        for err in sorted(
            validator.iter_errors(data), key=lambda e: list(map(str, e.absolute_path))
        )
    ]


def _cross_field_problems(data: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    tier_ids = [t["id"] for t in data["tiers"]]
    set_ids = [s["id"] for s in data["sets"]]
    ids = [q["id"] for q in data["questions"]] + [d["id"] for d in data["design_exercises"]]
    for label, values in (("tier", tier_ids), ("set", set_ids), ("question/exercise", ids)):
        repeated = sorted({v for v in values if values.count(v) > 1})
        if repeated:
            problems.append(f"repeated {label} ids: {repeated}")
    for q in data["questions"]:
        if q["tier"] not in tier_ids:
            problems.append(f"{q['id']}: tier {q['tier']!r} is not one of {tier_ids}")
        if q["set"] not in set_ids:
            problems.append(f"{q['id']}: set {q['set']!r} is not one of {set_ids}")
        slug = q["links"]["chapter"].split("#", 1)[0]
        if slug not in CHAPTER_SLUGS:
            problems.append(f"{q['id']}: chapter slug {slug!r} is not a book page slug")
    for d in data["design_exercises"]:
        if d["set"] not in set_ids:
            problems.append(f"{d['id']}: set {d['set']!r} is not one of {set_ids}")
    core = [q["id"] for q in data["questions"] if q["set"] == CORE_SET]
    if core != list(CORE_IDS):
        problems.append(
            f"set {CORE_SET!r} must hold exactly {CORE_IDS[0]}..{CORE_IDS[-1]} in order, got {core}"
        )
    problems.extend(_set_order_problems(data, tier_ids, set_ids))
    unused = [
        t
        for t in tier_ids
        if not any(q["tier"] == t for q in data["questions"] if q["set"] == CORE_SET)
    ]
    if unused:
        problems.append(f"tiers without a core question: {unused}")
    return problems


def _set_order_problems(data: dict[str, Any], tier_ids: list[str], set_ids: list[str]) -> list[str]:
    """Each set lists its questions tier by tier, numbered 1, 2, ... in file order (P1..P15), so the
    pages that show a set under tier headings show it in bank order."""
    problems = []
    for set_id in set_ids:
        questions = [q for q in data["questions"] if q["set"] == set_id]
        ranks = [tier_ids.index(q["tier"]) for q in questions if q["tier"] in tier_ids]
        if ranks != sorted(ranks):
            problems.append(f"set {set_id!r} must list its questions tier by tier, got "
                            f"{[(q['id'], q['tier']) for q in questions]}")
        numbers = [int(re.sub(r"\D", "", q["id"]) or 0) for q in questions]
        if numbers != list(range(1, len(questions) + 1)):
            problems.append(
                f"set {set_id!r} must number its questions 1..{len(questions)} in file order, "
                f"got {[q['id'] for q in questions]}"
            )
    return problems


def validate_raw(data: dict[str, Any]) -> None:
    """Raise BankError listing every schema violation and every broken cross-field rule."""
    problems = _schema_problems(data)
    if not problems:  # cross-field rules assume the shapes the schema guarantees
        problems = _cross_field_problems(data)
    if problems:
        raise BankError("invalid question bank:\n  " + "\n  ".join(problems))


def _question(raw: dict[str, Any]) -> Question:
    answer = raw["answer"]
    return Question(
        id=raw["id"],
        set=raw["set"],
        tier=raw["tier"],
        title=raw["title"],
        question=raw["question"].strip(),
        answer=Answer(
            answer["framework"].strip(),
            answer["key"].strip(),
            tuple(m.strip() for m in answer["mistakes"]),
        ),
        chapter=raw["links"]["chapter"],
        code=raw["links"]["code"],
        rubric=Rubric(
            tuple((i["points"], i["idea"].strip()) for i in raw["rubric"]["ideas"]),
            raw["rubric"]["mistake_points"],
        ),
    )


def _design_exercise(raw: dict[str, Any]) -> DesignExercise:
    return DesignExercise(
        id=raw["id"],
        set=raw["set"],
        title=raw["title"],
        prompt=raw["prompt"].strip(),
        functional=tuple(raw["requirements"]["functional"]),
        non_functional=tuple(raw["requirements"]["non_functional"]),
        model_answer=tuple(p.strip() for p in raw["model_answer"]),
    )


def load_bank(path: str | Path | None = None) -> Bank:
    """Read, validate and return the bank (the packaged ``bank.yaml`` unless ``path`` is given)."""
    data = load_raw(path)
    validate_raw(data)
    return Bank(
        tiers=tuple(Tier(t["id"], t["title"], t["blurb"].strip()) for t in data["tiers"]),
        sets={s["id"]: s["title"] for s in data["sets"]},
        questions=tuple(_question(q) for q in data["questions"]),
        design_exercises=tuple(_design_exercise(d) for d in data["design_exercises"]),
    )


def resolve_code_link(dotted: str) -> object:
    """Import the object a ``links.code`` entry names, e.g. ``"servelab.kv.BlockAllocator.free"``.

    The longest importable module prefix is imported and the rest is looked up attribute by
    attribute. Raises ImportError naming ``dotted`` when nothing matches.
    """
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        try:
            obj: object = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name is not None and not module.startswith(exc.name):
                raise  # the module exists but one of its own imports is missing
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            raise ImportError(
                f"dotted {dotted!r}: {module} has no {'.'.join(parts[cut:])}"
            ) from None
        return obj
    raise ImportError(f"dotted {dotted!r}: no importable module prefix")
