"""The architecture page's chapter -> module map and engine reading order, regenerated and held to the
notebooks and the files: every chapter present, each chapter's imports listed, line counts exact."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book" / "_ext"))

import course_map  # noqa: E402 (book/_ext/course_map.py)

PAGE = ROOT / "book" / "architecture.md"
BASE = "https://example.org/blob/main/"
ROW = re.compile(r"^\| \{doc\}`\.\./notebooks/([\w-]+)` \| (.*) \|$", re.MULTILINE)
LINK = re.compile(r"\[`([\w.]+)`\]\[([\w-]+)\]")
DEFINITION = re.compile(r"^\[([\w-]+)\]: (\S+)$", re.MULTILINE)
ORDER_ROW = re.compile(r"^\| (\d+) \| \[`([\w.]+)`\]\[([\w-]+)\] \| .* \| (\d+) \|$", re.MULTILINE)
TOTAL_ROW = re.compile(r"^\| \| total \| \| \| (\d+) \|$", re.MULTILINE)
IMPORT_LINE = re.compile(r"^[ \t]*(?:from[ \t]+(servelab[\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n]+)|import[ \t]+(servelab[\w.]*))",
                         re.MULTILINE)


@pytest.fixture(scope="module")
def page() -> str:
    return course_map.with_course_map(PAGE.read_text(), ROOT, BASE)


def definitions(text: str) -> dict[str, str]:
    return dict(DEFINITION.findall(text))


def repo_file(url: str) -> Path:
    assert url.startswith(BASE), url
    return ROOT / url[len(BASE):]


def is_module(name: str) -> bool:
    base = ROOT / "lib" / Path(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imported_by_lines(path: Path) -> set[str]:
    """The notebook's ``servelab`` imports found by scanning import lines (not ``ast``), shortened the
    way the page prints them (``servelab.kv.eviction`` -> ``kv.eviction``): ``from M import a, b``
    counts the names that are modules, and ``M`` itself unless every name is one."""
    found = set()
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type != "code":
            continue
        for module, names, plain in IMPORT_LINE.findall(cell.source):
            if plain:
                found.add(plain)
                continue
            imported = [n.split()[0] for n in names.strip("()").replace("\n", " ").split(",") if n.strip()]
            modules = [f"{module}.{n}" for n in imported if is_module(f"{module}.{n}")]
            found.update(modules if len(modules) == len(imported) else [module, *modules])
    return {m.split(".", 1)[1] if "." in m else m for m in found}


def test_the_page_has_each_marker_once_and_the_build_replaces_them(page):
    text = PAGE.read_text()
    for marker in (course_map.PACKAGE_MAP_MARKER, course_map.CHAPTER_MAP_MARKER, course_map.READING_ORDER_MARKER):
        assert text.count(marker) == 1
        assert marker not in page


def test_every_chapter_notebook_has_a_row(page):
    expected = sorted(p.stem for p in (ROOT / "notebooks").glob("ch*.ipynb")) + ["appendix-a-checks"]
    assert sorted(stem for stem, _ in ROW.findall(page)) == sorted(expected)


def test_each_row_lists_the_modules_its_notebook_imports(page):
    links = definitions(page)
    for stem, cell in ROW.findall(page):
        listed = [name for name, _ in LINK.findall(cell)]
        assert len(listed) == len(set(listed)), stem
        assert set(listed) == imported_by_lines(ROOT / "notebooks" / f"{stem}.ipynb"), stem
        for _, label in LINK.findall(cell):
            assert repo_file(links[label]).is_file(), label


def test_the_kv_chapter_lists_the_kv_package_modules(page):
    cell = dict(ROW.findall(page))["ch04-kv-cache"]
    listed = {name for name, _ in LINK.findall(cell)}
    assert {"kv", "kv.eviction", "kv.prefix_cache"} <= listed


def test_reading_order_line_counts_are_the_files(page):
    links = definitions(page)
    rows = ORDER_ROW.findall(page)
    assert [int(i) for i, *_ in rows] == list(range(1, len(course_map.ENGINE_STEP) + 1))
    counts = []
    for _, module, label, lines in rows:
        path = repo_file(links[label])
        assert path == course_map.module_path(f"servelab.{module}", ROOT)
        assert int(lines) == len(path.read_text().splitlines())
        counts.append(int(lines))
    assert len({module for _, module, _, _ in rows}) == len(rows), "a file listed twice"
    (total,) = TOTAL_ROW.findall(page)
    assert int(total) == sum(counts)


def servelab_imports(module: str) -> set[str]:
    """Modules (and package names) ``module``'s source imports from ``servelab``, by ``ast``."""
    tree = ast.parse(course_map.module_path(module, ROOT).read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("servelab"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("servelab"))
    return {m for m in found if course_map.module_path(m, ROOT).is_file()}


def test_every_reading_stop_is_reached_from_the_engine():
    reached, todo = set(), ["servelab.engine.engine"]
    while todo:
        module = todo.pop()
        if module not in reached:
            reached.add(module)
            todo.extend(servelab_imports(module))
    assert {module for module, _, _ in course_map.ENGINE_STEP} <= reached


def test_a_listed_object_that_moved_fails_the_build(monkeypatch):
    monkeypatch.setattr(course_map, "ENGINE_STEP", (("servelab.engine.engine", ("LLMEngine.no_such",), "x"),))
    with pytest.raises(AttributeError):
        course_map.engine_reading_order(ROOT)


def test_the_book_extension_fills_the_architecture_page():
    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    import servelab_book

    noted = []
    app = SimpleNamespace(srcdir=str(ROOT), env=SimpleNamespace(note_dependency=noted.append),
                          config=SimpleNamespace(html_theme_options={"repository_url": "https://example.org",
                                                                     "repository_branch": "main"}))
    source = [PAGE.read_text()]
    servelab_book.add_course_map(app, "book/architecture", source)
    assert course_map.CHAPTER_MAP_MARKER not in source[0] and ORDER_ROW.search(source[0])
    assert {Path(p).stem for p in noted} >= {"ch04-kv-cache", "appendix-a-checks"}
    other = ["% servelab: chapter module map"]
    servelab_book.add_course_map(app, "book/glossary", other)
    assert other == ["% servelab: chapter module map"]


# ---------------------------------------------------------------- the chapter -> package table

LIB = ROOT / "lib" / "servelab"
MAX_PLAIN_MODULES = 6  # plain modules at the top of the package, beside __init__ and __main__


def _beside_the_chapters() -> set[str]:
    """The packages and plain modules servelab/__init__.py's docstring names outside the chapter table."""
    doc = ast.get_docstring(ast.parse((LIB / "__init__.py").read_text())) or ""
    return set(re.findall(r"``(\w+)``", doc.split("Beside the chapters:", 1)[1]))


def test_the_table_covers_every_chapter_once_with_a_package_that_exists():
    rows = course_map.chapter_packages(ROOT)
    assert [row.chapter for row in rows] == [*map(str, range(10)), "A"]
    assert len({row.package for row in rows}) == len(rows)
    for row in rows:
        assert (LIB / row.package / "__init__.py").is_file() or (LIB / f"{row.package}.py").is_file(), row


def test_every_package_and_top_level_module_is_named_in_the_docstring():
    named = {row.package for row in course_map.chapter_packages(ROOT)} | _beside_the_chapters()
    packages = {path.parent.name for path in LIB.glob("*/__init__.py")}
    plain = {path.stem for path in LIB.glob("*.py")} - {"__init__", "__main__"}
    assert packages | plain == named, f"on disk, not named: {sorted(packages | plain - named)}; " \
                                      f"named, not on disk: {sorted(named - packages - plain)}"
    assert len(plain) <= MAX_PLAIN_MODULES, f"plain modules at the top: {sorted(plain)}"


def test_each_chapter_imports_its_package():
    """A chapter's notebooks (two for §2 and §7) import from the package the table gives it."""
    imported = course_map.chapter_modules(ROOT)
    for row in course_map.chapter_packages(ROOT):
        package = f"servelab.{row.package}"
        stems = [stem for stem in imported if stem.startswith(row.notebook_prefix)]
        assert stems, f"no notebook for chapter {row.chapter}"
        modules = {m for stem in stems for m in imported[stem]}
        assert any(m == package or m.startswith(package + ".") for m in modules), (stems, package)


def test_the_page_renders_the_table_from_the_docstring(page):
    for row in course_map.chapter_packages(ROOT):
        assert re.search(rf"^\| {row.chapter} \| .* \| \[`{row.package}`\]\[pkg-{row.package}\] \| "
                         rf"{re.escape(row.what)} \|$", page, re.MULTILINE), row


def test_a_chapter_row_in_the_docstring_reaches_the_page(tmp_path):
    (tmp_path / "lib" / "servelab").mkdir(parents=True)
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "lib" / "servelab" / "__init__.py").write_text('"""x\n\n  §4  kv  the KV cache\n"""\n')
    (tmp_path / "notebooks" / "ch04-kv-cache.ipynb").write_text("{}")
    table = course_map.package_map_markdown(tmp_path, BASE)
    assert "| 4 | {doc}`../notebooks/ch04-kv-cache` | [`kv`][pkg-kv] | the KV cache |" in table
