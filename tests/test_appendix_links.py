"""Appendix A and the chapters link each other, and the appendix names the functions each check calls.

``book/appendix-a-checks.md`` has one entry per check [D01]-[D10]: a target ``(check-dNN)=``, a
``{ref}`` to the chapter paragraph the check guards (target ``(guard-dNN)=``, which links back to
``check-dNN``), and the library functions the check calls, as ``[`module.name`][src-module]`` links to
their source file on GitHub. The function lists are typed in the page, so this test holds them to
the code: every name exists in its ``servelab`` module, is the object ``servelab.checks`` imports, is
called by the check (directly or through a helper in ``checks.py``), and links to the file that
defines it; and every library function a check calls is named.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import yaml

from servelab import checks

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
APPENDIX = BOOK / "appendix-a-checks.md"

TARGET = re.compile(r"^\(check-(d\d\d)\)=[ \t]*$", re.MULTILINE)
GUARD_TARGET = re.compile(r"^\(guard-(d\d\d)\)=[ \t]*$", re.MULTILINE)
GUARD_REF = re.compile(r"\{ref\}`[^`<]*<guard-(d\d\d)>`")
FUNCTION_LINK = re.compile(r"\[`([\w.]+)`\]\[([\w-]+)\]")
LINK_DEFINITION = re.compile(r"^\[([\w-]+)\]:[ \t]+(\S+)[ \t]*$", re.MULTILINE)
GLUE_TABLE = "```{glue} appA_table\n"


def check_ids() -> list[str]:
    """'d01' ... 'd10', from ``servelab.checks.CHECKS``."""
    return [check_id.lower() for check_id, _ in checks.CHECKS]


def entries(text: str) -> dict[str, str]:
    """Check id -> its entry: from its ``(check-dNN)=`` target to the next blank line."""
    return {m.group(1): text[m.end():].split("\n\n", 1)[0] for m in TARGET.finditer(text)}


REPOSITORY = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]
CHECKS_TREE = ast.parse(inspect.getsource(checks))


def source_url(obj: object) -> str:
    """The GitHub URL of the file that defines ``obj``, from ``repository`` in ``_config.yml``."""
    path = Path(inspect.getsourcefile(obj)).resolve().relative_to(ROOT).as_posix()
    return f"{REPOSITORY['url'].rstrip('/')}/blob/{REPOSITORY['branch']}/{path}"


def _module_functions() -> dict[str, ast.FunctionDef]:
    return {node.name: node for node in CHECKS_TREE.body if isinstance(node, ast.FunctionDef)}


def calls(function_name: str) -> tuple[set[str], set[str]]:
    """(names called, attribute names called) in a function of checks.py, through its helpers there.

    ``f(...)`` adds ``f`` to the names and, when ``f`` is a module-level function of checks.py, what
    ``f`` calls too; ``x.m(...)`` adds ``m`` to the attributes.
    """
    functions, names, attributes = _module_functions(), set(), set()
    todo, visited = [function_name], set()
    while todo:
        current = todo.pop()
        visited.add(current)
        for node in ast.walk(functions[current]):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                names.add(node.func.id)
                if node.func.id in functions and node.func.id not in visited:
                    todo.append(node.func.id)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                attributes.add(node.func.attr)
    return names, attributes


def library_calls(function_name: str) -> set[str]:
    """The public servelab callables a check calls, as 'module.name' (module inside servelab).

    Names bound in checks.py to objects of other servelab modules, named by the module checks.py
    imports them from, and public functions of checks.py itself (``checks.engine_tick``).
    """
    imported = {}
    for node in CHECKS_TREE.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("servelab."):
            imported.update({alias.asname or alias.name: node.module for alias in node.names})
    found = set()
    for name in calls(function_name)[0]:
        obj = getattr(checks, name, None)
        if name.startswith("_") or obj is None or name == function_name:
            continue
        if name in imported:
            found.add(f"{imported[name].removeprefix('servelab.')}.{name}")
        elif inspect.isfunction(obj) and obj.__module__ == checks.__name__:
            found.add(f"checks.{name}")
    return found


def split_name(dotted: str) -> tuple[str, str, list[str]]:
    """'kv.BlockAllocator.fork' -> ('kv', 'BlockAllocator', ['fork']); the module is the longest leading
    part that is a servelab module ('scheduling.batching.Request' -> ('scheduling.batching', 'Request', []))."""
    parts = dotted.split(".")
    for end in range(len(parts) - 1, 0, -1):
        try:
            importlib.import_module(f"servelab.{'.'.join(parts[:end])}")
        except ImportError:
            continue
        return ".".join(parts[:end]), parts[end], parts[end + 1:]
    return parts[0], parts[1] if len(parts) > 1 else "", parts[2:]


def resolve(dotted: str) -> tuple[object, object]:
    """'kv.BlockAllocator.fork' -> (servelab.kv.BlockAllocator, servelab.kv.BlockAllocator.fork)."""
    module, top, rest = split_name(dotted)
    obj = getattr(importlib.import_module(f"servelab.{module}"), top)
    target = obj
    for attribute in rest:
        target = getattr(target, attribute)
    return obj, target


def entry_problems(check_id: str, entry: str, link_urls: dict[str, str]) -> list[str]:
    """What is wrong with the functions named in one appendix entry (an empty list when nothing)."""
    function = dict((cid.lower(), f) for cid, f in checks.CHECKS)[check_id].__name__
    names, attributes = calls(function)
    named = FUNCTION_LINK.findall(entry)
    problems = [] if named else [f"{check_id}: names no function"]
    for dotted, ref in named:
        module, top, rest = split_name(dotted)
        try:
            obj, _ = resolve(dotted)
        except (ImportError, AttributeError) as error:
            problems.append(f"{check_id}: {dotted} does not exist ({error})")
            continue
        if module != "checks" and getattr(checks, top, None) is not obj:
            problems.append(f"{check_id}: checks.py does not use servelab.{module}.{top}")
        if top not in names or any(a not in attributes for a in rest):
            problems.append(f"{check_id}: {function} does not call {dotted}")
        if link_urls.get(ref) != source_url(obj):
            problems.append(f"{check_id}: {dotted} links to {link_urls.get(ref)}, not {source_url(obj)}")
    missing = library_calls(function) - {".".join(split_name(d)[:2]) for d, _ in named}
    problems += [f"{check_id}: {function} calls {name}, not named in its entry" for name in sorted(missing)]
    return problems


def guard_labels() -> dict[str, list[Path]]:
    """Guard id -> the book pages that carry its ``(guard-dNN)=`` target."""
    found: dict[str, list[Path]] = {}
    for page in sorted(BOOK.glob("*.md")):
        for guard in GUARD_TARGET.findall(page.read_text(encoding="utf-8")):
            found.setdefault(guard, []).append(page)
    return found


TEXT = APPENDIX.read_text(encoding="utf-8")
ENTRIES = entries(TEXT)
LINK_URLS = dict(LINK_DEFINITION.findall(TEXT))


def test_every_check_has_one_target_in_the_appendix():
    targets = TARGET.findall(TEXT)
    assert sorted(targets) == check_ids() and len(set(targets)) == len(targets), targets


def test_each_entry_names_the_functions_its_check_calls():
    problems = [p for check_id in check_ids() for p in entry_problems(check_id, ENTRIES[check_id], LINK_URLS)]
    assert not problems, "\n".join(problems)


def test_each_entry_links_its_guarded_paragraph_and_the_paragraph_links_back():
    labels, problems = guard_labels(), []
    for check_id in check_ids():
        refs = GUARD_REF.findall(ENTRIES[check_id])
        if refs != [check_id]:
            problems.append(f"check-{check_id} links guards {refs}, expected exactly guard-{check_id}")
        pages = labels.get(check_id, [])
        if len(pages) != 1:
            problems.append(f"guard-{check_id} is a target on {len(pages)} pages, expected 1")
        elif f"<check-{check_id}>`" not in pages[0].read_text(encoding="utf-8"):
            problems.append(f"{pages[0].name} has guard-{check_id} but no link back to check-{check_id}")
    stray = sorted(set(labels) - set(check_ids()))
    assert not problems and not stray, "\n".join(problems + [f"guard-{g} has no check" for g in stray])


def test_the_results_table_is_pasted_once_under_the_build_output():
    assert TEXT.count(GLUE_TABLE) == 1
    assert TEXT.index(GLUE_TABLE) > TEXT.index("## The output of this build")


def test_the_function_checks_catch_what_they_should():
    """A function the check does not call, a wrong source link, a name that does not exist and an
    unnamed call are all reported."""
    urls = {"ok": source_url(checks.softmax), "bad": "https://example.org/sampling.py"}
    good = "[`sampling.top_k_filter`][ok] [`sampling.top_p_filter`][ok] [`sampling.support`][ok]"

    def reported(check_id: str, entry: str, fragment: str) -> bool:
        return any(fragment in problem for problem in entry_problems(check_id, entry, urls))

    assert entry_problems("d02", good, urls) == []
    assert reported("d02", good + " [`sampling.softmax`][ok]", "does not call sampling.softmax")
    assert reported("d02", good.replace("[ok]", "[bad]", 1), "links to https://example.org")
    assert reported("d02", good + " [`sampling.no_such`][ok]", "does not exist")
    assert reported("d02", good.rsplit(" ", 1)[0], "calls sampling.support, not named")
    assert reported("d03", "[`kv.BlockAllocator.fork`][ok]", "does not call kv.BlockAllocator.fork")
    # a method that [D10] calls and [D08] does not
    assert reported("d08", "[`kv.BlockAllocator.num_blocks_to_allocate`][ok]",
                    "does not call kv.BlockAllocator.num_blocks_to_allocate")
    assert {"checks.engine_tick", "lifecycle.state_machine.reclaim"} <= library_calls("check_engine_tick")  # via engine_tick
