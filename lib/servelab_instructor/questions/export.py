"""Write an assignment from the bank: a student version with no answers in it, and an answer key.

``export_assignment(questions, out_dir)`` writes, per requested format,

* ``assignment.md`` / ``assignment.ipynb`` -- the student version: each question followed by an
  empty space to answer in. No answer text, no links to the answer, nothing folded: it is simply
  absent.
* ``answer-key.md`` / ``answer-key.ipynb`` -- the same questions with their three-part answers and
  links.

Both formats carry the question id in a machine-readable place (an HTML comment in Markdown, cell
metadata in a notebook), so ``read_markdown`` / ``read_notebook`` parse an exported file back into
``ExportedQuestion`` records. The tests use that round trip to prove ids and texts survive and that
the student files hold no answer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import nbformat

from servelab.questions.bank import Question
from servelab.questions.render import (
    answer_markdown,
    find_book_root,
    rubric_markdown,
    section_heading,
)

__all__ = [
    "FORMATS",
    "ExportedQuestion",
    "export_assignment",
    "read_markdown",
    "read_notebook",
    "rubric_markdown",
]

FORMATS = ("markdown", "notebook")
STUDENT_STEM = "assignment"
KEY_STEM = "answer-key"
_MARKER = "<!-- servelab-question: {} -->"
_MARKER_RE = re.compile(r"^<!-- servelab-question: ([A-Z][0-9]+) -->$", re.MULTILINE)
_STUDENT_HEADING = "### Your answer"
_KEY_HEADING = "### Answer"
_RESPONSE_PLACEHOLDER = (
    "_Write your answer here: framework, key formula or definition, common mistakes._"
)
_INSTRUCTIONS = (
    "Answer every question in three parts: the framework you would use, the key formula or "
    "definition, and the mistakes a weak answer makes."
)


@dataclass(frozen=True)
class ExportedQuestion:
    """A question as read back from an exported file; ``answer`` is None in a student version."""

    id: str
    title: str
    question: str
    answer: str | None


def _reference_line(q: Question) -> str:
    """Where to read (the section's number and title, from the book sources) and what to run."""
    root = find_book_root(Path(__file__).resolve().parent)
    heading = section_heading(root, q.chapter_slug, q.chapter_label) if root else None
    where = str(heading) if heading else f"the chapter page {q.chapter_slug}"
    return f"Read: {where} · run: `{q.code}`"


def _key_answer(q: Question) -> str:
    return f"{answer_markdown(q.answer)}\n\n{rubric_markdown(q)}\n\n{_reference_line(q)}"


# -------------------------------------------------------------------------------- markdown


def _markdown(questions: list[Question], title: str, with_answers: bool) -> str:
    kind = "answer key" if with_answers else "student version"
    parts = [f"# {title} ({kind})\n\n{_INSTRUCTIONS}\n"]
    for q in questions:
        block = f"## {q.id} · {q.title}\n{_MARKER.format(q.id)}\n\n{q.question}\n\n"
        if with_answers:
            block += f"{_KEY_HEADING}\n\n{_key_answer(q)}\n"
        else:
            block += f"{_STUDENT_HEADING}\n\n{_RESPONSE_PLACEHOLDER}\n"
        parts.append(block)
    return "\n".join(parts)


def read_markdown(path: str | Path) -> list[ExportedQuestion]:
    """Parse an exported Markdown assignment or answer key back into its questions, in file
    order."""
    text = Path(path).read_text(encoding="utf-8")
    matches = list(_MARKER_RE.finditer(text))
    records = []
    for i, match in enumerate(matches):
        heading = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        title = heading.split(" · ", 1)[1] if " · " in heading else heading
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        body = text[match.end(): end]
        body = body[: body.rfind("\n## ")] if i + 1 < len(matches) else body
        records.append(_split_body(match.group(1), title, body))
    return records


def _split_body(qid: str, title: str, body: str) -> ExportedQuestion:
    if f"\n{_KEY_HEADING}\n" in body:
        question, answer = body.split(f"\n{_KEY_HEADING}\n", 1)
        return ExportedQuestion(qid, title, question.strip(), answer.strip())
    question = body.split(f"\n{_STUDENT_HEADING}\n", 1)[0]
    return ExportedQuestion(qid, title, question.strip(), None)


# -------------------------------------------------------------------------------- notebook


def _cell(source: str, role: str, qid: str | None = None) -> nbformat.NotebookNode:
    meta = {"role": role} if qid is None else {"role": role, "question_id": qid}
    return nbformat.v4.new_markdown_cell(source, metadata={"servelab": meta})


def _notebook(questions: list[Question], title: str, with_answers: bool) -> nbformat.NotebookNode:
    kind = "answer key" if with_answers else "student version"
    cells = [_cell(f"# {title} ({kind})\n\n{_INSTRUCTIONS}", "title")]
    for q in questions:
        cells.append(_cell(f"## {q.id} · {q.title}\n\n{q.question}", "question", q.id))
        if with_answers:
            cells.append(_cell(_key_answer(q), "answer", q.id))
        else:
            cells.append(_cell(_RESPONSE_PLACEHOLDER, "response", q.id))
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    return nb


def read_notebook(path: str | Path) -> list[ExportedQuestion]:
    """Parse an exported notebook back into its questions (ids from cell metadata), in file
    order."""
    nb = nbformat.read(str(path), as_version=4)
    questions: dict[str, tuple[str, str]] = {}
    answers: dict[str, str] = {}
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("servelab", {})
        if meta.get("role") == "question":
            heading, _, text = cell.source.partition("\n\n")
            questions[meta["question_id"]] = (heading.split(" · ", 1)[-1], text.strip())
        elif meta.get("role") == "answer":
            answers[meta["question_id"]] = cell.source.strip()
    return [
        ExportedQuestion(qid, title, text, answers.get(qid))
        for qid, (title, text) in questions.items()
    ]


# -------------------------------------------------------------------------------- export


def export_assignment(
    questions: list[Question],
    out_dir: str | Path,
    formats: tuple[str, ...] | list[str] = FORMATS,
    title: str = "servelab interview questions",
    key_dir: str | Path | None = None,
) -> list[Path]:
    """Write the student version and the answer key in every format of ``formats``; returns the
    paths.

    ``formats`` holds ``"markdown"`` and/or ``"notebook"``. The student version goes to ``out_dir``,
    the answer key to ``key_dir`` (default: ``out_dir`` too; give a folder of its own so the folder
    you hand out holds no key). Folders are created if missing; files of the same names are
    overwritten.
    """
    if not questions or not all(isinstance(q, Question) for q in questions):
        raise ValueError("questions must be a non-empty list of Question")
    chosen = list(dict.fromkeys(formats))
    bad = [f for f in chosen if f not in FORMATS]
    if bad or not chosen:
        raise ValueError(f"formats must be a non-empty subset of {FORMATS}, got {list(formats)}")
    out, key_out = Path(out_dir), Path(key_dir if key_dir is not None else out_dir)
    if key_dir is not None and out.resolve() == key_out.resolve():
        raise ValueError(
            f"key_dir must differ from out_dir to keep the key apart, got {str(key_out)!r} twice"
        )
    written = []
    for stem, with_answers in ((STUDENT_STEM, False), (KEY_STEM, True)):
        out = key_out if with_answers else Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        if "markdown" in chosen:
            path = out / f"{stem}.md"
            path.write_text(_markdown(questions, title, with_answers), encoding="utf-8")
            written.append(path)
        if "notebook" in chosen:
            path = out / f"{stem}.ipynb"
            nbformat.write(_notebook(questions, title, with_answers), str(path))
            written.append(path)
    return written
