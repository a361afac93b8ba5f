"""Notebooks read well in Jupyter and Colab: no raw MyST in what Jupyter shows, data written as words.

Jupyter renders a notebook's Markdown cells and its cell outputs as CommonMark; a MyST role
(``{doc}`...```), directive (```` ```{exercise} ````, ``:::``) or target (``(label)=``) shows up there as
raw text. The book keeps its MyST: the §9 page renders the question bank as MyST only during the
book build, and the narrative pages (``book/*.md``) are not notebooks. Outputs under a
``application/papermill.record/`` mime type (``publish``/glue) are data for the book that Jupyter
never displays, so they are not checked.

What a reader of a chapter notebook sees (Markdown cells, printed text, Markdown and HTML outputs,
figure text), and every value it publishes for the book's pages to glue, must not show a Python
boolean ("True") or a hedged plural ("token(s)"): flags are words ("yes", "holds") and counts agree
with their noun (:mod:`servelab.prose`). Code is not checked: code cells' sources, inline code and
code blocks, and the script around a figure's data. ``browser_tests/test_book_text.py`` checks the
same on every page of the built book.

On the book page a chapter notebook must not read as a wall of code: no run of consecutive shown code
lines, between two Markdown cells, is longer than :data:`MAX_CODE_RUN`. A cell whose input the page
hides (tags ``remove-input``, ``hide-input``, ``remove-cell``) shows no code lines.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from servelab.questions import load_bank
from servelab.questions.design import DesignAssumptions, solve_design
from servelab.questions.render import design_exercise_view, find_book_root, tier_view
from servelab.viz.core import BOOK_BUILD_ENV

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for p in (ROOT / "notebooks").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)

MYST = re.compile(
    r"\{(?:doc|exercise|solution|ref|term|cite(?::[pt])?|numref|eq|download|math)\}"  # roles and directives
    r"|\{glue"                                      # {glue}, {glue:text}, {glue:figure}, ...
    r"|^[ \t]*:::"                                  # colon-fenced directives
    r"|^[ \t]*`{3,}[ \t]*\{[a-z]"                   # backtick-fenced directives
    r"|^\([\w.-]+\)=[ \t]*$",                       # (label)= targets
    re.MULTILINE,
)


def _shown_texts(cell: nbformat.NotebookNode) -> list[tuple[str, str]]:
    """(where, text) for what Jupyter displays of a cell: a Markdown cell's source, or its outputs."""
    if cell.cell_type == "markdown":
        return [("markdown", cell.source)]
    shown = []
    for out in cell.get("outputs", []):
        if out.output_type == "stream":
            shown.append(("stream", out.text))
        elif out.output_type == "error":
            shown.append(("error", "\n".join(out.traceback)))
        else:
            shown += [(mime, str(value)) for mime, value in out.get("data", {}).items()
                      if not mime.startswith("application/papermill.record/") and mime.startswith("text/")]
    return shown


def raw_myst(path: Path) -> list[str]:
    """Every raw MyST construct Jupyter would show in ``path``: 'cell N (where): match'."""
    nb = nbformat.read(str(path), as_version=4)
    found = []
    for index, cell in enumerate(nb.cells):
        for where, text in _shown_texts(cell):
            found += [f"cell {index} ({where}): {m.group(0).strip()!r}" for m in MYST.finditer(text)]
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[str(p.relative_to(ROOT / "notebooks")) for p in NOTEBOOKS])
def test_no_raw_myst_in_what_jupyter_shows(path):
    found = raw_myst(path)
    assert not found, f"{path.relative_to(ROOT)} shows raw MyST in Jupyter: " + "; ".join(found[:8])


def test_the_pattern_catches_what_it_must():
    for text in ("see {doc}`x`", "```{exercise} Q1", "````{solution} q", ":::{glue} a", "{glue:text}`nb::x:.1f`",
                 "(ch09-interview)=", "{ref}`a <b>`"):
        assert MYST.search(text), text
    for text in ("a dict {'k': 1}", "<details>", "`code`", "f(x) = {x}", "x := 1"):
        assert not MYST.search(text), text


BANK = load_bank()
BOOK_ROOT = find_book_root(ROOT / "notebooks")


def _views():
    views = [tier_view(BANK, t.id, s, BOOK_ROOT) for s in ("core", "pipeline") for t in BANK.tiers
             if BANK.select(tiers=[t.id], set_id=s)]
    return views + [design_exercise_view(BANK.design_exercises[0], solve_design(DesignAssumptions()))]


def test_question_bank_in_jupyter_is_folded_markdown(monkeypatch):
    monkeypatch.delenv(BOOK_BUILD_ENV, raising=False)
    for view in _views():
        text = view._repr_markdown_()
        assert not MYST.search(text), MYST.search(text).group(0)
        assert text.count("<details>") == text.count("</details>") >= 1
        assert "<summary>" in text and "MyST" not in repr(view)


def test_question_bank_in_the_book_build_stays_myst(monkeypatch):
    monkeypatch.setenv(BOOK_BUILD_ENV, "1")
    for view in _views():
        text = view._repr_markdown_()
        assert "{exercise}" in text and "{solution}" in text and ":class: dropdown" in text
        assert "<details>" not in text


def test_every_answer_is_behind_a_fold(monkeypatch):
    monkeypatch.delenv(BOOK_BUILD_ENV, raising=False)
    text = tier_view(BANK, "L1", "core", BOOK_ROOT)._repr_markdown_()
    for question in BANK.select(tiers=["L1"], set_id="core"):
        framework = question.answer.framework.split()[0:6]
        start = text.index(f"**{question.id} · ")
        fold = text.index("<details>", start)
        assert text.find(" ".join(framework), start) > fold


CHAPTERS = sorted((ROOT / "notebooks").glob("ch*.ipynb"))
BOOLEAN = re.compile(r"(?<![\w.])(?:True|False)(?![\w(])")
HEDGED_PLURAL = re.compile(r"\w\(s\)")
CODE = re.compile(r"```.*?```|`[^`\n]*`|<(code|pre)\b.*?</\1>", re.DOTALL)
SCRIPT = re.compile(r"<script\b.*?</script>", re.DOTALL)
JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def reader_text(where: str, text: str) -> str:
    """What a reader reads in ``text``: code left out, and of a figure's script only its strings."""
    if where == "text/html":
        text = SCRIPT.sub(lambda m: " ".join(JSON_STRING.findall(m.group(0))), text)
    return CODE.sub(" ", text)


GLUED = "application/papermill.record/"


def _glued_texts(cell: nbformat.NotebookNode) -> list[tuple[str, str]]:
    """(mime, text) of every value a cell publishes for the book ({glue:text} pastes text/plain)."""
    return [(f"glued {mime.removeprefix(GLUED)}", str(value)) for out in cell.get("outputs", [])
            for mime, value in out.get("data", {}).items() if mime.startswith(f"{GLUED}text/")]


def data_not_words(path: Path) -> list[str]:
    """Every boolean or hedged plural a reader sees in ``path``: 'cell N (where): ...context...'."""
    nb = nbformat.read(str(path), as_version=4)
    found = []
    for index, cell in enumerate(nb.cells):
        for where, text in [*_shown_texts(cell), *_glued_texts(cell)]:
            kind = where.removeprefix("glued ")
            if kind not in {"markdown", "stream", "text/markdown", "text/html"} and where != "glued text/plain":
                continue
            text = reader_text(kind, text)
            for match in (*BOOLEAN.finditer(text), *HEDGED_PLURAL.finditer(text)):
                found.append(f"cell {index} ({where}): {text[max(match.start() - 50, 0):match.end() + 10]!r}")
    return found


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_chapter_notebooks_write_flags_and_counts_as_words(path):
    found = data_not_words(path)
    assert not found, f"{path.relative_to(ROOT)} shows data as code: " + "; ".join(found[:6])


def test_a_glued_flag_is_caught(tmp_path):
    cell = nbformat.v4.new_code_cell('publish("same", str(True))')
    cell.outputs = [nbformat.v4.new_output("display_data", data={f"{GLUED}text/plain": "'True'"}),
                    nbformat.v4.new_output("display_data", data={"text/plain": "Checkbox(value=False)"})]
    path = tmp_path / "ch99.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), str(path))
    assert data_not_words(path) == ["cell 0 (glued text/plain): \"'True'\""]


def test_the_word_patterns_catch_what_they_must():
    for where, text in (("stream", "identity holds: True\n"), ("stream", "[True, False]"),
                        ("text/html", '<td class="txt">False</td>'), ("markdown", "keeps 1 token(s)"),
                        ("text/html", '<script>Plotly.newPlot("x", [{"hovertext": ["1 decode token(s)"]}])</script>')):
        text = reader_text(where, text)
        assert BOOLEAN.search(text) or HEDGED_PLURAL.search(text), text
    for where, text in (("markdown", "set `ignore_eos=True` to"), ("text/html", "<th>t (s)</th>"),
                        ("text/html", '<script>function f(s) { return s.True; }</script>'),
                        ("stream", "finished: yes"), ("markdown", "```python\nx = True\n```")):
        text = reader_text(where, text)
        assert not (BOOLEAN.search(text) or HEDGED_PLURAL.search(text)), text


MAX_CODE_RUN = 40
HIDDEN_INPUT = {"remove-input", "hide-input", "remove-cell"}


def shown_code_runs(nb: nbformat.NotebookNode) -> list[tuple[int, int]]:
    """(shown code lines, index of the run's first cell) for every run of code cells between Markdown cells."""
    runs, lines, first = [], 0, None
    for index, cell in enumerate([*nb.cells, nbformat.v4.new_markdown_cell("")]):
        if cell.cell_type == "markdown":
            if lines:
                runs.append((lines, first))
            lines, first = 0, None
        elif cell.cell_type == "code" and not HIDDEN_INPUT & set(cell.metadata.get("tags", [])):
            lines += len(cell.source.splitlines())
            first = index if first is None else first
    return runs


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_no_wall_of_code_on_a_chapter_page(path):
    longest, first = max(shown_code_runs(nbformat.read(str(path), as_version=4)), default=(0, None))
    assert longest <= MAX_CODE_RUN, f"{path.name}: {longest} shown code lines in a row from cell {first}"


def test_code_runs_break_at_markdown_and_skip_hidden_input():
    code = nbformat.v4.new_code_cell
    hidden = code("x\n" * 50)
    hidden.metadata["tags"] = ["remove-input"]
    nb = nbformat.v4.new_notebook(cells=[code("a\nb"), hidden, code("c"), nbformat.v4.new_markdown_cell("m"),
                                         code("d\n" * 41)])
    assert shown_code_runs(nb) == [(3, 0), (41, 4)]
