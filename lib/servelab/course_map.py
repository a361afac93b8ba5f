"""The chapter -> module map and the engine's reading order, read from the notebooks and the sources.

:func:`chapter_modules` parses every chapter notebook's code cells (``notebooks/ch*.ipynb`` and the
appendix) with :mod:`ast` and collects the ``servelab`` modules each one imports. :func:`engine_reading_order`
lists the files a reader walks through for one ``LLMEngine.step``, each with the line count of the file
as it is now. :func:`with_course_map` renders both as MyST tables in place of their marker lines; the book's
extension applies it to the architecture page at build time, so the map cannot drift from the code.
"""

from __future__ import annotations

import ast
import importlib
from dataclasses import dataclass
from pathlib import Path

import nbformat

__all__ = ["ENGINE_STEP", "CHAPTER_MAP_MARKER", "READING_ORDER_MARKER", "ReadingStop", "chapter_notebooks",
           "notebook_modules", "chapter_modules", "module_path", "engine_reading_order", "chapter_map_markdown",
           "reading_order_markdown", "with_course_map"]

CHAPTER_MAP_MARKER = "% servelab: chapter module map"
READING_ORDER_MARKER = "% servelab: engine reading order"
PACKAGE = "servelab"

# One default engine step (EngineConfig(), SamplingParams()), file by file in the order a reader meets them:
# (module, what to read there, why). What a default step does not run lives off this walk: tracing
# (engine.trace), swapping (engine.swap), the up-front rule (engine.reservation), the n > 1 fork
# (engine.parallel_sampling), logits processors, grammar masks, truncation filters, logprobs, and the
# queueing disciplines beyond FCFS (queue_disciplines).
ENGINE_STEP: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("servelab.engine.engine", ("EngineCore.step", "EngineCore._run"), "the step's five phases, in order"),
    ("servelab.engine.scheduler", ("Scheduler.schedule", "ReservationPolicy.admit"),
     "phase 1: decodes, prefill chunks, admissions under the on-demand rule, preemption by recompute"),
    ("servelab.queue_policy", ("fcfs", "rank_waiting"), "the order the waiting queue is served in (FCFS)"),
    ("servelab.kv.block_pool", ("BlockPool.allocate_prompt", "BlockPool.append_tokens"),
     "block tables, reservations, prefix hits"),
    ("servelab.engine.model_runner", ("ForwardInput.from_chunks", "ModelRunner.execute", "PagedAttention"),
     "phases 2 and 3: the chunks as one flat batch, the forward pass, K/V through block tables"),
    ("servelab.engine.cpu_linear", ("PackedLinear.forward",),
     "phase 3's linear layers on a CPU: one row a GEMV, several rows oneDNN on prepacked weights"),
    ("servelab.engine.sampler", ("sample_tokens",), "phase 4: one token per sample, batched"),
    ("servelab.engine.sequence", ("Sequence", "accept_token", "request_output"),
     "phase 5 on the per-sample record: text, stop strings, finish reasons, outputs"),
)


@dataclass(frozen=True)
class ReadingStop:
    """One file of the engine's reading order: its module, the objects to read, why, and its length."""

    module: str
    names: tuple[str, ...]
    what: str
    path: Path
    lines: int


def chapter_notebooks(root: Path) -> list[Path]:
    """The chapter notebooks (``notebooks/ch*.ipynb``) and the appendix's, in file-name order."""
    notebooks = root / "notebooks"
    return sorted(notebooks.glob("ch*.ipynb")) + sorted(notebooks.glob("appendix-*.ipynb"))


def _imported(node: ast.AST, root: Path) -> list[str]:
    """The ``servelab`` modules one import statement brings in: ``from servelab import kv`` -> kv,
    ``from servelab.kv import BlockAllocator`` -> servelab.kv (a name counts as a module when
    ``root/lib`` has its source file)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == PACKAGE]
    if not isinstance(node, ast.ImportFrom) or node.level or (node.module or "").split(".")[0] != PACKAGE:
        return []
    names = [f"{node.module}.{a.name}" for a in node.names]
    submodules = [name for name in names if module_path(name, root).is_file()]
    return submodules if len(submodules) == len(names) else [node.module, *submodules]


def notebook_modules(path: Path, root: Path) -> list[str]:
    """Sorted ``servelab`` modules imported by the code cells of the notebook at ``path``."""
    modules: set[str] = set()
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type == "code":
            tree = ast.parse(cell.source)
            for node in ast.walk(tree):
                modules.update(_imported(node, root))
    return sorted(modules)


def chapter_modules(root: Path) -> dict[str, list[str]]:
    """Notebook stem (``ch04-kv-cache``) -> the ``servelab`` modules it imports, for every chapter."""
    return {path.stem: notebook_modules(path, root) for path in chapter_notebooks(root)}


def module_path(module: str, root: Path) -> Path:
    """The source file of ``module`` under ``root/lib`` (a package's ``__init__.py``)."""
    base = root / "lib" / Path(*module.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def _resolve(module: str, name: str) -> object:
    """The object ``name`` (dotted, e.g. ``LLMEngine.step``) of ``module``; AttributeError if gone."""
    obj: object = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def engine_reading_order(root: Path) -> list[ReadingStop]:
    """The files of one ``LLMEngine.step``, in reading order (:data:`ENGINE_STEP`), with their line
    counts; raises AttributeError when an object to read no longer exists where it is listed."""
    stops = []
    for module, names, what in ENGINE_STEP:
        for name in names:
            _resolve(module, name)
        path = module_path(module, root)
        stops.append(ReadingStop(module, names, what, path, len(path.read_text().splitlines())))
    return stops


def _short(module: str) -> str:
    """``servelab.kv.eviction`` -> ``kv.eviction`` (the package itself stays ``servelab``)."""
    return module.split(".", 1)[1] if "." in module else module


def _link(module: str, prefix: str) -> str:
    """A reference-style link to ``module``'s source, defined by :func:`_definitions`."""
    return f"[`{_short(module)}`][{prefix}-{_short(module).replace('.', '-')}]"


def _definitions(modules: set[str], prefix: str, root: Path, source_base: str) -> list[str]:
    """The link definitions of :func:`_link`: ``source_base`` + each module's repository path."""
    return [f"[{prefix}-{_short(m).replace('.', '-')}]: {source_base}"
            f"{module_path(m, root).relative_to(root).as_posix()}" for m in sorted(modules)]


def chapter_map_markdown(root: Path, source_base: str) -> str:
    """The chapter -> module table as MyST Markdown, module names linked to their source files;
    ``source_base`` is the URL repository paths are appended to (``https://github.com/O/R/blob/B/``)."""
    chapters = chapter_modules(root)
    rows = ["| chapter | modules its notebook imports |", "| --- | --- |"]
    rows += [f"| {{doc}}`../notebooks/{stem}` | {', '.join(_link(m, 'src') for m in modules) or 'none'} |"
             for stem, modules in chapters.items()]
    used = {m for modules in chapters.values() for m in modules}
    return "\n".join([*rows, "", *_definitions(used, "src", root, source_base)])


def reading_order_markdown(root: Path, source_base: str) -> str:
    """The engine's reading order as a MyST table with each file's line count and the total."""
    stops = engine_reading_order(root)
    rows = ["| # | file | read | what it does | lines |", "| --- | --- | --- | --- | ---: |"]
    for i, stop in enumerate(stops, 1):
        names = ", ".join(f"`{name}`" for name in stop.names)
        rows.append(f"| {i} | {_link(stop.module, 'read')} | {names} | {stop.what} | {stop.lines} |")
    rows.append(f"| | total | | | {sum(stop.lines for stop in stops)} |")
    return "\n".join([*rows, "", *_definitions({s.module for s in stops}, "read", root, source_base)])


def with_course_map(text: str, root: Path, source_base: str) -> str:
    """``text`` (a MyST page) with each marker line replaced by its generated table."""
    lines = text.split("\n")
    render = {CHAPTER_MAP_MARKER: chapter_map_markdown, READING_ORDER_MARKER: reading_order_markdown}
    return "\n".join(render[line.strip()](root, source_base) if line.strip() in render else line
                     for line in lines)
