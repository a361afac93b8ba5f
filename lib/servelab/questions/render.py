"""Turn bank entries into Markdown: MyST for the book's §9 page, plain Markdown for notebooks and
exports.

Book pages: each question is a sphinx-exercise ``exercise`` directive and its answer a ``solution``
directive with ``:class: dropdown``, so the answer stays folded until opened and disappears entirely
when the book is built with solutions hidden (sphinx-exercise's ``hide_solutions``, the switch
described on the instructor page). The §9 chapter page holds ``{servelab-questions} SET`` blocks
that the book's extension expands (:func:`expand_question_sets`) into a heading per tier and that
tier's questions. The §9 notebook displays the same MyST with the cell metadata ``{"mystnb":
{"markdown_format": "myst"}}`` so myst-nb parses the directives; its labels carry their own prefix
so the two pages never define the same label.

Jupyter and Colab do not know MyST, so the same notebook cells display a :class:`BankView`: during
the book build (``servelab.viz.core.in_book_build``) it is the MyST above, everywhere else plain
Markdown with every answer folded in an HTML ``<details>`` element and links as ordinary Markdown
links. The saved outputs of the committed notebook are therefore plain Markdown.

Chapter links become ``{numref}`` links when the target label exists in the book sources (Sphinx
fills in the section's number and title as the book numbers them), a page link when only the page
exists, and plain text otherwise, so the strict build never meets a dangling reference. Outside the
build (notebooks, exports, answer keys) :func:`section_heading` reads the same number and title from
the page.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from servelab.questions.bank import Answer, Bank, DesignExercise, Question, Tier
from servelab.questions.design import DesignResult, design_table_markdown
from servelab.viz.core import in_book_build

__all__ = [
    "BankView",
    "answer_markdown",
    "rubric_markdown",
    "design_exercise_notebook",
    "design_exercise_view",
    "notebook_chapter_link",
    "question_notebook",
    "tier_notebook",
    "tier_view",
    "chapter_link",
    "design_exercise_myst",
    "expand_question_sets",
    "find_book_root",
    "label_defined",
    "question_myst",
    "section_heading",
    "set_page_myst",
    "SectionHeading",
    "tier_heading",
    "tier_myst",
]

FENCE = "````"  # four backticks: answers may contain ``` code blocks of their own
# labels of the questions on the chapter page: ch09-q1, ch09-q1-answer
PAGE_LABELS = "ch09"
NOTEBOOK_LABELS = "ch09-nb"    # the notebook page shows the same questions; labels must not repeat


def answer_markdown(answer: Answer) -> str:
    """The three parts of an answer as Markdown paragraphs and a bullet list."""
    mistakes = "\n".join(f"- {m}" for m in answer.mistakes)
    return (
        f"**Framework.** {answer.framework}\n\n"
        f"**Key formula / definition.** {answer.key}\n\n"
        f"**Common mistakes.**\n\n{mistakes}"
    )


def rubric_markdown(q: Question) -> str:
    """The marking rubric: what a full answer must state (points per key idea) and what loses points
    (each common mistake the answer makes)."""
    ideas = "\n".join(f"- **{points} pt{'s' if points > 1 else ''}**: {idea}"
                      for points, idea in q.rubric.ideas)
    lose = q.rubric.mistake_points
    return (
        f"**Rubric ({q.rubric.max_points} points).** A full answer states every key idea below; "
        f"award an idea's points when the answer states it:\n\n{ideas}\n\n"
        f"**Loses points.** Take off {lose} point{'s' if lose > 1 else ''} for each common mistake "
        "above that the answer makes (never below 0)."
    )


def find_book_root(start: Path) -> Path | None:
    """The repository root above ``start`` (the folder holding ``_toc.yml``), or None outside a
    checkout."""
    for folder in (start, *start.parents):
        if (folder / "_toc.yml").is_file():
            return folder
    return None


def label_defined(root: Path, slug: str, label: str) -> bool:
    """True when ``label`` is a MyST target in the chapter's page or notebook under ``root``.

    Recognised forms: a ``(label)=`` target line, or ``:label: label`` / ``:name: label`` options.
    """
    pattern = re.compile(
        rf"\({re.escape(label)}\)=|:(?:label|name):[ \t]*{re.escape(label)}(?![\w-])"
    )
    for path in (root / "book" / f"{slug}.md", root / "notebooks" / f"{slug}.ipynb"):
        if path.is_file() and pattern.search(path.read_text(encoding="utf-8")):
            return True
    return False


@dataclass(frozen=True)
class SectionHeading:
    """A labelled heading of a chapter page: its number as the book prints it ("3.2") and its
    title."""

    number: str
    title: str

    def __str__(self) -> str:
        return f"§{self.number} {self.title}"


_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*$")
_CHAPTER = re.compile(r"^ch(\d\d)-")
_FENCE = re.compile(r"^\s*(`{3,}|:{3,})")


def _plain(title: str) -> str:
    """A heading's text without MyST markup: roles keep their text, backticks and emphasis go."""
    title = re.sub(r"\{[\w:-]+\}`([^`<]*?)\s*(?:<[^>]*>)?`", r"\1", title)
    return re.sub(r"[`*]", "", title).strip()


def _headings(lines: list[str]):
    """(level, title, label) for every heading outside fenced blocks; label is the target above
    it."""
    fence, label = None, None
    for line in lines:
        marker = _FENCE.match(line)
        if marker and (
            fence is None or marker.group(1)[0] == fence[0] and len(marker.group(1)) >= len(fence)
        ):
            fence = None if fence else marker.group(1)
            continue
        if fence:
            continue
        target = re.fullmatch(r"\(([\w-]+)\)=\s*", line)
        heading = _HEADING.match(line)
        if heading:
            yield len(heading.group(1)), _plain(heading.group(2)), label
        label = target.group(1) if target else (label if not line.strip() else None)


def section_heading(root: Path, slug: str, label: str) -> SectionHeading | None:
    """The number and title of the heading that ``(label)=`` marks in ``book/<slug>.md``, or None.

    Chapters are numbered from their slug (``ch03-...`` is chapter 3) and headings in page order,
    as the book's numbered table of contents does; a page without a chapter slug gets no number.
    """
    path, chapter = root / "book" / f"{slug}.md", _CHAPTER.match(slug)
    if not path.is_file():
        return None
    counts = [int(chapter.group(1)) if chapter else 0]
    for level, title, target in _headings(path.read_text(encoding="utf-8").splitlines()):
        depth = max(level - 1, 0)
        counts = counts[: depth + 1] + [0] * (depth + 1 - len(counts))
        if depth:
            counts[depth] += 1
        if target == label:
            return SectionHeading(".".join(map(str, counts)) if chapter else "", title)
    return None


def chapter_link(question: Question, root: Path | None, page_dir: str = "notebooks") -> str:
    """MyST link from a page in ``root/page_dir`` to the section that teaches ``question``.

    With the label defined the link is ``{numref}``, so its text is the section's number and title
    as the built book shows them.
    """
    text = question.chapter_slug
    if root is None:
        return text
    if label_defined(root, question.chapter_slug, question.chapter_label):
        return f"{{numref}}`§{{number}} {{name}} <{question.chapter_label}>`"
    if (root / "book" / f"{question.chapter_slug}.md").is_file():
        up = "../" * len(Path(page_dir).parts)
        return f"[{text}]({up}book/{question.chapter_slug}.md)"
    return text


def question_myst(question: Question, root: Path | None, page_dir: str = "notebooks",
                  label_prefix: str = PAGE_LABELS) -> str:
    """One question as an ``exercise`` directive followed by its ``solution`` dropdown."""
    label = f"{label_prefix}-{question.id.lower()}"
    links = (
        f"**Read and run.** {chapter_link(question, root, page_dir)} · "
        f"`{question.code}`"
    )
    return (
        f"{FENCE}{{exercise}} {question.id} · {question.title}\n:label: {label}\n:nonumber:\n\n"
        f"{question.question}\n{FENCE}\n\n"
        f"{FENCE}{{solution}} {label}\n:label: {label}-answer\n:class: dropdown\n\n"
        f"{answer_markdown(question.answer)}\n\n{rubric_markdown(question)}\n\n{links}\n{FENCE}\n"
    )


def tier_myst(bank: Bank, tier_id: str, set_id: str, root: Path | None, page_dir: str = "notebooks",
              label_prefix: str = PAGE_LABELS) -> str:
    """Every question of ``set_id`` in tier ``tier_id``, preceded by the tier's description."""
    tier = bank.tier(tier_id)
    questions = bank.select(tiers=[tier_id], set_id=set_id)
    body = "\n".join(question_myst(q, root, page_dir, label_prefix) for q in questions)
    return f"*{tier.blurb}*\n\n{body}"


def tier_heading(tier: Tier) -> str:
    """A tier's heading text, e.g. "L1 · Must-know"."""
    return f"{tier.id} · {tier.title}"


def set_page_myst(bank: Bank, set_id: str, root: Path | None, level: int = 3) -> str:
    """Every question of ``set_id`` for the chapter page: a heading per tier, questions in bank
    order."""
    sections = [
        f"{'#' * level} {tier_heading(tier)}\n\n{tier_myst(bank, tier.id, set_id, root, 'book')}"
        for tier in bank.tiers if bank.select(tiers=[tier.id], set_id=set_id)
    ]
    return "\n".join(sections)


QUESTION_SET = re.compile(r"^```\{servelab-questions\} ([\w-]+)[ \t]*\n```[ \t]*$", re.MULTILINE)


def expand_question_sets(page: str, bank: Bank, root: Path | None) -> str:
    """``page`` with every ``{servelab-questions} SET`` block replaced by :func:`set_page_myst`.

    The book's extension applies this to a page's source before MyST parses it, so §9 shows the bank
    itself; nothing of it is pasted into the page.
    """
    return QUESTION_SET.sub(lambda match: set_page_myst(bank, match.group(1), root), page)


def design_exercise_myst(exercise: DesignExercise, result: DesignResult) -> str:
    """The design exercise: prompt and requirements visible, model answer and table in a
    dropdown."""
    label = f"ch09-{exercise.id.lower()}"
    functional = "\n".join(f"1. {r}" for r in exercise.functional)
    non_functional = "\n".join(f"1. {r}" for r in exercise.non_functional)
    points = "\n".join(f"- {p}" for p in exercise.model_answer)
    return (
        f"{FENCE}{{exercise}} {exercise.id} · {exercise.title}\n:label: {label}\n:nonumber:\n\n"
        f"{exercise.prompt}\n\n**Functional requirements**\n\n{functional}\n\n"
        f"**Non-functional requirements**\n\n{non_functional}\n{FENCE}\n\n"
        f"{FENCE}{{solution}} {label}\n:label: {label}-answer\n:class: dropdown\n\n"
        f"{points}\n\n{design_table_markdown(result)}\n{FENCE}\n"
    )


# ------------------------------------------------------------------------------ Jupyter and Colab


def notebook_chapter_link(
    question: Question, root: Path | None, page_dir: str = "notebooks"
) -> str:
    """A plain Markdown link from ``root/page_dir`` to the teaching section, titled "§3.3 Truncation
    ...".

    Text only (the page slug) when the page is missing; the page top when the label is.
    """
    heading = section_heading(root, question.chapter_slug, question.chapter_label) if root else None
    if root is None or not (root / "book" / f"{question.chapter_slug}.md").is_file():
        return question.chapter_slug
    target = f"{'../' * len(Path(page_dir).parts)}book/{question.chapter_slug}.md"
    if heading is None:
        return f"[{question.chapter_slug}]({target})"
    return f"[{heading}]({target}#{question.chapter_label})"


def _folded(summary: str, body: str) -> str:
    """An HTML ``<details>`` block whose body is Markdown (blank lines keep it Markdown)."""
    return f"<details>\n<summary>{summary}</summary>\n\n{body}\n\n</details>"


def question_notebook(question: Question, root: Path | None, page_dir: str = "notebooks") -> str:
    """One question as plain Markdown: title and question visible, the answer folded."""
    links = (
        f"**Read and run.** {notebook_chapter_link(question, root, page_dir)} · `{question.code}`"
    )
    answer = f"{answer_markdown(question.answer)}\n\n{rubric_markdown(question)}\n\n{links}"
    return (
        f"**{question.id} · "
        f"{question.title}**\n\n{question.question}\n\n{_folded('Answer', answer)}\n"
    )


def tier_notebook(
    bank: Bank, tier_id: str, set_id: str, root: Path | None, page_dir: str = "notebooks"
) -> str:
    """Every question of ``set_id`` in tier ``tier_id`` as plain Markdown, answers folded."""
    questions = bank.select(tiers=[tier_id], set_id=set_id)
    body = "\n---\n\n".join(question_notebook(q, root, page_dir) for q in questions)
    return f"*{bank.tier(tier_id).blurb}*\n\n{body}"


def design_exercise_notebook(exercise: DesignExercise, result: DesignResult) -> str:
    """The design exercise as plain Markdown: prompt and requirements visible, model answer
    folded."""
    functional = "\n".join(f"1. {r}" for r in exercise.functional)
    non_functional = "\n".join(f"1. {r}" for r in exercise.non_functional)
    points = "\n".join(f"- {p}" for p in exercise.model_answer)
    answer = _folded("Model answer", f"{points}\n\n{design_table_markdown(result)}")
    return (
        f"**{exercise.id} · {exercise.title}**\n\n{exercise.prompt}\n\n**Functional "
        f"requirements**\n\n"
        f"{functional}\n\n**Non-functional requirements**\n\n{non_functional}\n\n{answer}\n"
    )


@dataclass(frozen=True)
class BankView:
    """What a §9 notebook cell displays: MyST in the book build, folded plain Markdown elsewhere."""

    myst: str
    notebook: str
    summary: str

    def _repr_markdown_(self) -> str:
        return self.myst if in_book_build() else self.notebook

    def __repr__(self) -> str:
        return self.summary


def tier_view(
    bank: Bank, tier_id: str, set_id: str, root: Path | None, page_dir: str = "notebooks"
) -> BankView:
    """The tier's questions for a notebook cell (see :class:`BankView`)."""
    count = len(bank.select(tiers=[tier_id], set_id=set_id))
    return BankView(tier_myst(bank, tier_id, set_id, root, page_dir, NOTEBOOK_LABELS),
                    tier_notebook(bank, tier_id, set_id, root, page_dir),
                    f"{count} questions, tier {tier_id}, set {set_id}")


def design_exercise_view(exercise: DesignExercise, result: DesignResult) -> BankView:
    """The design exercise for a notebook cell (see :class:`BankView`)."""
    return BankView(
        design_exercise_myst(exercise, result),
        design_exercise_notebook(exercise, result),
        f"design exercise {exercise.id}",
    )
