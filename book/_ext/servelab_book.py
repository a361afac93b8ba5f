"""The book's local Sphinx extension: offline figures, fresh notebook outputs, a solutions switch.

1. plotly.js is served by the book itself: the copy inside the installed ``plotly`` package is
   copied into ``_build/html/_static`` when the build finishes and loaded on every page before any
   figure (see :func:`servelab.viz.core.figure_html`). Nothing large is committed and no figure needs
   the network.
2. Stale outputs: jupyter-cache keys a notebook by its code cells, so an edit under ``lib/`` would
   leave old figures in place. When the library's files change, the execution cache is dropped and
   every page is read again.
3. A narrative page that pastes values from a notebook (``{glue}`` with ``NB.ipynb::name``) is rebuilt
   whenever that notebook changes.
4. ``SERVELAB_BOOK_BUILD=1`` is set for the notebook kernels, so :mod:`servelab.viz.core` leaves
   out the mime types the book cannot render (plotly's JSON, widget views).
5. Each script is emitted once per page (sphinx-thebe's set-up script is otherwise doubled).
6. ``SERVELAB_SOLUTIONS=0`` in the environment builds the book without exercise solutions
   (sphinx-exercise's ``hide_solutions``); ``make book SOLUTIONS=0`` sets it.
7. Every chapter page that has a notebook of the same name (``book/<slug>.md`` and
   ``notebooks/<slug>.ipynb``) gets an "Open in Colab" link to that notebook under its title, made
   from the one repository URL and branch in ``_config.yml`` (the same ones the launch buttons use).
8. MathJax is served by the book itself too: MathJax 3's ``tex-chtml.js`` with the components it loads
   on demand (TeX extensions, CommonHTML fonts, the menu) is copied from the PyPI package
   ``django-static-mathjax`` into ``_static/mathjax`` (``mathjax_path`` in ``_config.yml`` points
   there), so formulas render with no network.
9. Every notebook is executed in a process of its own under a hard wall-clock limit
   (:func:`nbrun.run_notebook`, ``SERVELAB_NOTEBOOK_LIMIT_S``, default 600 s): jupyter-cache's
   in-process executor is replaced, so a notebook that hangs is killed with its kernel, and the build
   fails with a warning naming the notebook and the cell it was running. The notebooks a build will
   execute are started before Sphinx reads the first page, two at a time on a machine with two cores
   or more (``SERVELAB_BOOK_JOBS``; :func:`prefetch_notebooks`): each page then waits only for its own.
   A notebook whose metadata says ``"servelab": {"timing": true}`` times things: it is started only
   after every other prefetched notebook has ended, and such notebooks run one at a time, so a
   timing cell never shares the machine with another notebook.
   A fresh run's checked cells (tag ``nbval-check-output``) must print what the notebook was
   committed with, compared by nbval's rules (:func:`checked_output_differences`; figures and live
   controls aside, which the book renders differently): the clean install checks them whole under
   the other CPU kernel family, the book under this CPU's own.
10. ``{servelab-questions} SET`` blocks (the §9 page) are replaced, before MyST reads the page, by
   the question bank's set ``SET`` under a heading per tier
   (:func:`servelab.questions.render.expand_question_sets`).
11. The chapters count from 0 (the state machine is chapter 0): Sphinx numbers a toctree from 1, so
   after it has assigned section numbers every number's first component is lowered by one. Only the
   "Chapters" part of ``_toc.yml`` is numbered, so every numbered page is a chapter page.
13. This machine is measured once per build, before any notebook runs
    (:mod:`servelab.bench.machine`), into ``machine-profile.json`` beside the execution cache; every
    notebook kernel reads it through ``SERVELAB_MACHINE_PROFILE``, so every page quotes one profile.
    It is measured again only when the execution cache is dropped (no cached output then quotes it).
12. The architecture page's chapter -> module map and engine reading order are generated
    (:func:`course_map.with_course_map`): each marker line becomes a table read from the
    chapter notebooks' imports and the engine's files, linked to the source on GitHub at the branch in
    ``_config.yml``. The page is read again whenever a notebook changes.
"""

from __future__ import annotations

import codecs
import hashlib
import os
import re
import shutil
import sys
from pathlib import Path

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.environment.collectors.toctree import TocTreeCollector
from sphinx.environment import BuildEnvironment
from sphinx.util import logging

# The notebook runner is build machinery, not library: it lives in tools/ (tools/nbrun.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))

LOGGER = logging.getLogger(__name__)
PLOTLY_JS = "plotly.min.js"
LIB_DIR = Path("lib") / "servelab"
LIB_STAMP = "servelab-lib.sha1"
GLUE_SOURCE = re.compile(r"([\w./-]+\.ipynb)::")


def plotly_js_source() -> Path:
    """The plotly.min.js bundled in the installed plotly package."""
    import plotly

    path = Path(plotly.__file__).parent / "package_data" / PLOTLY_JS
    if not path.is_file():
        raise FileNotFoundError(f"plotly.min.js not found at {path}; is plotly installed fully?")
    return path


def copy_plotly_js(app: Sphinx, exception: Exception | None) -> None:
    """After an HTML build, put plotly.min.js next to the theme's static files."""
    if exception is None and app.builder.format == "html":
        static = Path(app.outdir) / "_static"
        static.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(plotly_js_source(), static / PLOTLY_JS)


MATHJAX_ENTRY = "tex-chtml.js"
MATHJAX_PARTS = ("input", "output", "ui", "a11y", "adaptors")  # loaded on demand by the entry script


def mathjax_source() -> Path:
    """The MathJax 3 ``es5`` folder shipped by the ``django-static-mathjax`` package."""
    import mathjax

    path = Path(mathjax.__file__).parent / "static" / "mathjax" / "es5"
    if not (path / MATHJAX_ENTRY).is_file():
        raise FileNotFoundError(f"MathJax's {MATHJAX_ENTRY} not found under {path}")
    return path


def copy_mathjax(app: Sphinx, exception: Exception | None) -> None:
    """After an HTML build, put MathJax (entry script and on-demand components) into _static/mathjax."""
    if exception is None and app.builder.format == "html":
        source, target = mathjax_source(), Path(app.outdir) / "_static" / "mathjax"
        target.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / MATHJAX_ENTRY, target / MATHJAX_ENTRY)
        for part in MATHJAX_PARTS:
            shutil.copytree(source / part, target / part, dirs_exist_ok=True)


def solutions_switch(app: Sphinx, config) -> None:
    """Honour SERVELAB_SOLUTIONS=0 (build without solutions); any other value keeps them."""
    value = os.environ.get("SERVELAB_SOLUTIONS", "1").strip()
    if value not in {"0", "1"}:
        raise ValueError(f"SERVELAB_SOLUTIONS must be 0 or 1, got {value!r}")
    config.hide_solutions = value == "0"


def library_digest(root: Path) -> str:
    """A hash of every file of the servelab package (sources and shipped assets)."""
    digest = hashlib.sha1()
    for path in sorted((root / LIB_DIR).rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def execution_cache(app: Sphinx) -> Path:
    """myst-nb's jupyter-cache folder; refuses anything but a ``.jupyter_cache`` folder."""
    cache = Path(app.env.mystnb_config.execution_cache_path).resolve()
    if cache.name != ".jupyter_cache":
        raise ValueError(f"unexpected execution cache path {cache}; refusing to delete it")
    return cache


def reread_on_library_change(app: Sphinx, env: BuildEnvironment, added, changed,
                             removed) -> list[str]:
    """If lib/ changed since the last build, drop the execution cache and re-read every page."""
    stamp = Path(app.doctreedir) / LIB_STAMP
    current = library_digest(Path(app.srcdir))
    if stamp.exists() and stamp.read_text() == current:
        return []
    cache = execution_cache(app)
    if cache.is_dir():
        LOGGER.info("servelab: lib/ changed, dropping the notebook execution cache %s", cache)
        shutil.rmtree(cache)
    machine_profile_path(app).unlink(missing_ok=True)
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(current)
    return sorted(env.found_docs)


def note_glue_sources(app: Sphinx, docname: str, source: list[str]) -> None:
    """Record that a page pasting from NB.ipynb depends on that notebook file."""
    for rel in set(GLUE_SOURCE.findall(source[0])):
        app.env.note_dependency(app.env.relfn2path(rel, docname)[1])


def unshadow_latex_codec() -> None:
    """Let sphinxcontrib-bibtex find the ``ulatex`` codec.

    ``future-typing`` (a dependency of ``typical``) registers, from a ``.pth`` file, a codec search
    function that answers every codec name, ``ulatex`` included, so pybtex fails on any author name.
    Unregistering that function restores normal codec lookup; nothing else in the build uses it.
    """
    try:
        from future_typing.codec import search_function
    except ImportError:
        return
    for _ in range(100):  # it can be registered more than once; each call removes one
        try:
            if codecs.lookup("servelab-no-such-codec").name != "future_typing":
                return
        except LookupError:
            return
        codecs.unregister(search_function)
    raise RuntimeError("could not unregister future_typing's codec search function")


def drop_duplicate_scripts(app: Sphinx, pagename: str, templatename: str, context: dict,
                           doctree) -> None:
    """Emit each script once. sphinx-thebe adds its inline ``const THEBE_JS_URL = ...`` twice under
    Jupyter Book, and the second copy throws "Identifier has already been declared" in browsers."""
    seen, unique = set(), []
    for script in context.get("script_files", []):
        attributes = getattr(script, "attributes", {})
        filename = getattr(script, "filename", script) or ""  # inline scripts: None or ""
        key = (str(filename), tuple(sorted(attributes.items())))
        if key not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"] = unique


def _from_zero(number):
    """A section number with its chapter component lowered by one; empty numbers stay as they are."""
    return type(number)((number[0] - 1, *number[1:])) if number else number


def chapters_from_zero(app: Sphinx, env: BuildEnvironment) -> list[str]:
    """Renumber chapters 1..N as 0..N-1: headings, the sidebar, prev/next links, then figures."""
    for docname, anchors in env.toc_secnumbers.items():
        for anchor, number in anchors.items():
            anchors[anchor] = _from_zero(number)
        for reference in env.tocs[docname].findall(nodes.reference):
            if reference.get("secnumber"):
                reference["secnumber"] = _from_zero(list(reference["secnumber"]))
        title = env.titles.get(docname)
        if title is not None and title.get("secnumber"):
            title["secnumber"] = _from_zero(list(title["secnumber"]))
    TocTreeCollector.assign_figure_numbers(None, env)  # figure numbers carry the section number
    return sorted(env.toc_secnumbers)


COLAB_BADGE = ("```{{admonition}} Run this chapter\n:class: tip\n"
               "[Open its notebook in Colab]({url}), or read the code and outputs on the notebook "
               "page [](../notebooks/{slug}.ipynb).\n```\n")


def colab_url(repository_url: str, branch: str, colab: str, notebook: str) -> str:
    """Colab's URL for ``notebook`` (a path in the repository) on GitHub at ``branch``."""
    prefix = "https://github.com/"
    if not repository_url.startswith(prefix):
        raise ValueError(f"repository.url must start with {prefix}, got {repository_url!r}")
    repo = repository_url[len(prefix):].strip("/")
    return f"{colab.rstrip('/')}/github/{repo}/blob/{branch}/{notebook}"


def with_colab_link(text: str, url: str, slug: str) -> str:
    """``text`` (a MyST page) with the Colab admonition right under its first ``# `` title."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.startswith("# "):
            badge = COLAB_BADGE.format(url=url, slug=slug)
            return "".join([*lines[:i + 1], "\n", badge, *lines[i + 1:]])
    raise ValueError(f"page for {slug} has no '# ' title to put the Colab link under")


def add_colab_link(app: Sphinx, docname: str, source: list[str]) -> None:
    """An "Open in Colab" link under the title of each chapter page that has a notebook."""
    if not docname.startswith("book/"):
        return
    slug = docname.split("/", 1)[1]
    notebook = f"notebooks/{slug}.ipynb"
    if not (Path(app.srcdir) / notebook).is_file():
        return
    options = app.config.html_theme_options
    url = colab_url(options["repository_url"], options.get("repository_branch", "main"),
                    options.get("launch_buttons", {}).get("colab_url", "https://colab.research.google.com"),
                    notebook)
    source[0] = with_colab_link(source[0], url, slug)


COURSE_MAP_PAGE = "book/architecture"


def add_course_map(app: Sphinx, docname: str, source: list[str]) -> None:
    """The generated chapter -> module map and engine reading order on the architecture page."""
    if docname != COURSE_MAP_PAGE:
        return
    from course_map import chapter_notebooks, with_course_map

    root = Path(app.srcdir)
    options = app.config.html_theme_options
    base = f"{options['repository_url'].rstrip('/')}/blob/{options.get('repository_branch', 'main')}/"
    source[0] = with_course_map(source[0], root, base)
    for notebook in chapter_notebooks(root):
        app.env.note_dependency(str(notebook))


def expand_questions(app: Sphinx, docname: str, source: list[str]) -> None:
    """Put the question bank's sets on the pages that ask for them with ``{servelab-questions} SET``."""
    from servelab.questions import load_bank
    from servelab.questions.render import QUESTION_SET, expand_question_sets

    if QUESTION_SET.search(source[0]):
        source[0] = expand_question_sets(source[0], load_bank(), Path(app.srcdir))


NOTEBOOK_LIMIT_ENV = "SERVELAB_NOTEBOOK_LIMIT_S"
NOTEBOOK_LIMIT_S = 600


def _overridden(nb, timeout, allow_errors, meta_override=True):
    """The cell timeout and error policy a notebook runs with: its own ``execution`` metadata wins."""
    if meta_override and "execution" in nb.metadata:
        timeout = nb.metadata.execution.get("timeout", timeout)
        allow_errors = nb.metadata.execution.get("allow_errors", allow_errors)
    return timeout, allow_errors


def _run_with_deadline(nb, cwd, timeout, allow_errors):
    """One notebook in a child process under the hard limit (a :class:`nbrun.NotebookRun`)."""
    from nbrun import run_notebook

    limit = float(os.environ.get(NOTEBOOK_LIMIT_ENV, NOTEBOOK_LIMIT_S))
    return run_notebook(nb, limit_s=limit, cwd=Path(cwd), cell_timeout_s=timeout or limit,
                        allow_errors=allow_errors, name=Path(cwd).name)


def execute_with_deadline(nb, cwd, timeout, allow_errors, meta_override=True, **_ignored):
    """jupyter-cache's ``single_nb_execution`` (same arguments, same result), but in a child process
    killed at the hard limit, or taken from the run :func:`prefetch_notebooks` started for this
    notebook. A timeout comes back as ``CellTimeoutError`` naming the cell, which myst-nb reports as a
    warning on the notebook's page (``-W`` makes it fail the build)."""
    from jupyter_cache.executors.utils import ExecutionResult
    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    timeout, allow_errors = _overridden(nb, timeout, allow_errors, meta_override)
    started = PREFETCHED.pop((str(Path(cwd).resolve()), code_digest(nb), timeout, allow_errors), None)
    run = started.result() if started else _run_with_deadline(nb, cwd, timeout, allow_errors)
    differences = checked_output_differences(nb, run.notebook) if run.ok else []
    if run.notebook is not None:
        nb["cells"], nb["metadata"] = run.notebook.cells, run.notebook.metadata
    if differences:
        text = (f"{len(differences)} checked output(s) differ from the committed ones (re-run "
                f"tools/execute_notebooks.py on it if the change is meant): " + "; ".join(differences))
        return ExecutionResult(nb, cwd, run.seconds, CellExecutionError(text, "error", text), text)
    if run.ok:
        return ExecutionResult(nb, cwd, run.seconds)
    where = f"cell {run.cell} (`{run.cell_line}`)" if run.cell is not None else "before its first cell"
    text = f"{'hung' if run.timed_out else 'failed'} at {where}: {run.error}"
    err = CellTimeoutError(text) if run.timed_out else CellExecutionError(text, "error", run.error or "")
    return ExecutionResult(nb, cwd, run.seconds, err, text)


SANITIZE = Path(__file__).resolve().parents[2] / "notebooks" / "sanitize.cfg"
NOT_COMPARED = {"metadata", "traceback", "prompt_number", "output_type", "name", "execution_count",
                "application/vnd.jupyter.widget-view+json", "image/png", "image/jpeg"}
"""The output fields nbval leaves out of a comparison (its defaults without nbdime)."""
RICH = ("text/html", "application/vnd.jupyter.widget-view+json")
"""Outputs with these are figures or live controls, which the book build renders differently on
purpose (:func:`servelab.viz.core.in_book_build`); the book compares what a checked cell prints."""


def _compared(outputs: list, patterns: list[tuple[str, str]]) -> dict[str, list]:
    """What a cell prints, as nbval compares it: streams merged by name, each field (and each mime
    type of ``data``) a list of values, strings passed through the sanitizers; figures and widgets
    (:data:`RICH`) left out."""
    import copy

    from nbval.plugin import coalesce_streams, transform_streams_for_comparison

    def sanitized(value):
        for regex, replace in patterns if isinstance(value, str) else ():
            value = re.sub(regex, replace, value)
        return value

    printed = [o for o in copy.deepcopy(outputs) if not any(k in o.get("data", {}) for k in RICH)]
    fields: dict[str, list] = {}
    for output in transform_streams_for_comparison(coalesce_streams(printed)):
        for key, value in output.items():
            for field, item in value.items() if key == "data" else [(key, value)]:  # data's mime types flattened
                if key not in NOT_COMPARED and field not in NOT_COMPARED:
                    fields.setdefault(field, []).append(sanitized(item))
    return fields


def checked_output_differences(saved, executed) -> list[str]:
    """``cell K (`first line`): field`` for each checked cell whose fresh outputs (``executed``) differ
    from the committed ones (``saved``), compared by nbval's rules and ``notebooks/sanitize.cfg``."""
    from nbval.plugin import get_sanitize_patterns

    from nbrun import is_checked

    patterns = get_sanitize_patterns(SANITIZE.read_text())
    saved_code = [c for c in saved.cells if c.cell_type == "code"]
    fresh_code = [c for c in executed.cells if c.cell_type == "code"]
    found = []
    for index, (old, new) in enumerate(zip(saved_code, fresh_code)):
        if not is_checked(old):
            continue
        want, got = _compared(old.get("outputs", []), patterns), _compared(new.get("outputs", []), patterns)
        if want != got:
            field = next((k for k in sorted(set(want) | set(got)) if want.get(k) != got.get(k)), "")
            first = next((line.strip() for line in old.source.splitlines() if line.strip()), "")[:80]
            was, now = ("".join(map(str, fields.get(field, [])))[:160] for fields in (want, got))
            found.append(f"cell {index} (`{first}`): {field} was {was!r}, now {now!r}")
    return found


BOOK_JOBS_ENV = "SERVELAB_BOOK_JOBS"
PREFETCHED: dict = {}
"""Notebook runs started ahead of Sphinx's reading, keyed by (folder, code digest, timeout, allow_errors)."""
_POOL: list = []


def code_digest(nb) -> str:
    """A hash of a notebook's code cells: the key a prefetched run is matched to its page by."""
    digest = hashlib.sha1()
    for cell in nb.cells:
        if cell.cell_type == "code":
            digest.update(cell.source.encode() + b"\0")
    return digest.hexdigest()


def _needs_execution(app: Sphinx, nb) -> bool:
    """Whether myst-nb will execute this notebook: always in ``force`` mode, on a cache miss in ``cache``."""
    mode = app.env.mystnb_config.execution_mode
    if mode == "force":
        return True
    if mode != "cache":
        return False
    from jupyter_cache import get_cache

    try:
        get_cache(str(execution_cache(app))).match_cache_notebook(nb)
    except KeyError:
        return True
    return False


def machine_profile_path(app: Sphinx) -> Path:
    """This build's machine profile: ``machine-profile.json`` beside the execution cache."""
    return execution_cache(app).parent / "machine-profile.json"


def measure_machine_once(app: Sphinx, env: BuildEnvironment, docnames: list[str]) -> None:
    """Measure this machine before any notebook runs (in a child process, so the build's own torch
    settings stay untouched), unless this build's profile exists; name it for every kernel."""
    import subprocess
    import sys

    from servelab.bench.machine import PROFILE_ENV

    path = machine_profile_path(app)
    os.environ[PROFILE_ENV] = str(path)
    if not path.is_file():
        subprocess.run([sys.executable, "-m", "servelab.bench.machine", str(path)], check=True)


def is_timing_notebook(nb) -> bool:
    """Whether a notebook's metadata marks it as timing things (``"servelab": {"timing": true}``)."""
    return bool(nb.metadata.get("servelab", {}).get("timing", False))


def _after(waited: list, run, *args):
    """``run(*args)`` once every future in ``waited`` has ended (whatever its outcome)."""
    from concurrent.futures import wait

    wait(waited)
    return run(*args)


def prefetch_notebooks(app: Sphinx, env: BuildEnvironment, docnames: list[str]) -> None:
    """Start every notebook that is about to be read and executed, ``SERVELAB_BOOK_JOBS`` at a time
    (default: one per core, at most 2), the slowest first (:func:`nbrun.slowest_first`), so
    that the last to end is a short one. Each run keeps its own hard limit."""
    import nbformat
    from concurrent.futures import ThreadPoolExecutor

    jobs = int(os.environ.get(BOOK_JOBS_ENV, min(2, os.cpu_count() or 1)))
    config = env.mystnb_config
    if jobs < 2 or config.execution_in_temp:
        return
    from nbrun import slowest_first

    pool = serial = None
    shared, timing = [], []
    notebooks = [Path(env.doc2path(docname)) for docname in docnames]
    for path in slowest_first([path for path in notebooks if path.suffix == ".ipynb"]):
        nb = nbformat.read(path, as_version=4)
        if _needs_execution(app, nb):
            (timing if is_timing_notebook(nb) else shared).append((path, nb))
    for path, nb in shared + timing:
        timeout, allow_errors = _overridden(nb, config.execution_timeout, config.execution_allow_errors)
        key = (str(path.parent.resolve()), code_digest(nb), timeout, allow_errors)
        args = (nb, path.parent, timeout, allow_errors)
        if is_timing_notebook(nb):  # alone: after every shared run, one at a time
            serial = serial or ThreadPoolExecutor(max_workers=1, thread_name_prefix="servelab-timing")
            others = [PREFETCHED[k] for k in list(PREFETCHED)]
            PREFETCHED[key] = serial.submit(_after, others, _run_with_deadline, *args)
        else:
            pool = pool or ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="servelab-prefetch")
            PREFETCHED[key] = pool.submit(_run_with_deadline, *args)
    _POOL.extend(p for p in (pool, serial) if p)
    if pool or serial:
        LOGGER.info("servelab: executing %d notebooks, %d at a time, then %d timing ones alone",
                    len(shared), jobs, len(timing))


def stop_prefetching(app: Sphinx, exception: Exception | None) -> None:
    """Drop the runs no page claimed (a build that stopped early); a run under way ends at its limit."""
    while _POOL:
        _POOL.pop().shutdown(wait=False, cancel_futures=True)
    PREFETCHED.clear()


def use_deadline_executor() -> None:
    """Route myst-nb's notebook execution (cache and direct modes) through :func:`execute_with_deadline`."""
    import myst_nb.core.execute.cache as cache_mode
    import myst_nb.core.execute.direct as direct_mode

    cache_mode.single_nb_execution = direct_mode.single_nb_execution = execute_with_deadline


def setup(app: Sphinx) -> dict:
    unshadow_latex_codec()
    use_deadline_executor()
    # Notebook kernels inherit this; servelab.viz.core then emits only what the HTML renders.
    os.environ["SERVELAB_BOOK_BUILD"] = "1"
    app.connect("config-inited", solutions_switch)
    app.connect("env-get-outdated", reread_on_library_change)
    app.connect("env-before-read-docs", measure_machine_once, priority=850)  # before any notebook runs
    app.connect("env-before-read-docs", prefetch_notebooks, priority=900)  # after the re-read list is known
    app.connect("source-read", note_glue_sources)
    app.connect("env-get-updated", chapters_from_zero, priority=900)  # after the toctree collector
    app.connect("source-read", add_colab_link)
    app.connect("source-read", add_course_map)
    app.connect("source-read", expand_questions)
    app.connect("build-finished", copy_plotly_js)
    app.connect("build-finished", stop_prefetching)
    app.connect("build-finished", copy_mathjax)
    app.connect("html-page-context", drop_duplicate_scripts, priority=900)  # after the others
    # Loaded synchronously in <head>, so window.Plotly exists before any figure's inline script.
    app.add_js_file(PLOTLY_JS, priority=100)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
