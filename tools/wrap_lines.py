"""Rewrite Python files so that every line is at most 100 characters, without changing behaviour.

Run on a tree that other work has changed as often as needed: a line already short enough is never
touched, so a second run changes nothing. Each file is rewritten in five passes, each only where a
line is too long:

1. a trailing comment that makes its line too long moves onto its own lines just above the code (a
   pragma such as ``# noqa: F401`` stays where it is; only its explanation moves);
2. a block of comment lines is re-wrapped by paragraph;
3. a docstring is re-wrapped by paragraph (the paragraph with the too-long line only);
4. code goes through ``ruff format --line-length 100 --range``: only the statement holding the long
   line is formatted, so the diff stays small (ruff's settings: ``[tool.ruff]`` in pyproject.toml);
5. a string literal ruff could not break is split at a space into adjacent literals (``"ab " "cd"``,
   one string to Python) and the statement formatted again.

Re-wrapping keeps indentation, bullet lists and their hanging indents (``-``, ``*``, ``1.``,
Google-style ``name: text`` fields), ``::`` literal blocks, doctest lines and their output, tables
(reST ``===`` and Markdown ``|``), lines with aligned columns and ``.. directive`` lines as they
are, and never breaks a word (a URL stays whole).

Safety: a file is written only when its syntax tree is unchanged except for whitespace inside
docstrings (the same check as ``--check-ast``); otherwise it is left as it was and named. Lines that
stay too long (a table row, a long URL, a long line inside a multi-line string) are listed at the
end.

Usage::

    python tools/wrap_lines.py lib                      # rewrite every .py file under lib/ in place
    python tools/wrap_lines.py --check-ast HEAD lib     # each tree as HEAD's (docstring spaces aside)
    python tools/wrap_lines.py --list lib               # the lines over 100 characters, and why
    python tools/wrap_lines.py --write-allow-list tests/data/long_lines_allowed.txt lib

Needs ruff (pinned in requirements.txt).
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import subprocess
import sys
import textwrap
import tokenize
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WIDTH = 100
# A pragma read by a tool must stay on its line; only the words after it may move.
PRAGMA = re.compile(r"#\s*(noqa(:\s*[A-Z]+[0-9]+(,\s*[A-Z]+[0-9]+)*)?|type:\s*ignore(\[[^\]]*\])?"
                    r"|pragma:\s*no\s*cover|fmt:\s*(skip|off|on)|pylint:\s*\S+)")
BULLET = re.compile(r"^([-*+\u2022]|\d{1,2}[.)]|\(\w{1,3}\))\s+")
# "name: text", "``name``: text", "a / b: text", "name (type): text": a field of an Args-style list.
FIELD = re.compile(
    r"^(``[^`]+``|\*{0,2}[\w.]+\*{0,2})(\s*/\s*(``[^`]+``|[\w.]+))*(\s*\([^)]*\))?:\s"
)
# A short line ending in ":" ("Args:", "Raises:", "For example:") heads what follows; a longer one
# is a sentence that goes on.
HEADER = re.compile(r"^[A-Za-z][\w (),/-]{0,40}:$")
# A divider comment, "# ------ the phases": its run of dashes is shortened, not wrapped.
DIVIDER = re.compile(r"^([-=*#~_])\1{9,}")
RST_TABLE_RULE = re.compile(r"^=+(\s+=+)+$")
ALIGNED = re.compile(r"[^\s.!?:;,]\s{2,}\S")  # two spaces inside a line: columns kept aligned
# A word that would read as markup at the start of a line: kept glued to the word before it.
MARKUP_WORD = re.compile(r"^([-*+|#\u2022]|--|>>>|\.\.\.|\d{1,2}[.)]|\.\.|::)$")
GLUE = "\x00"


# ---------------------------------------------------------------- paragraphs of text


@dataclass
class Line:
    """One line of a docstring or comment block: its indentation (spaces) and text (stripped)."""

    indent: int
    text: str


def _split_paragraphs(lines: list[Line]) -> list[tuple[bool, list[int]]]:
    """The lines grouped as ``(reflowable, line indexes)``: a reflowable group is one paragraph (a
    first line, then lines of one indentation: its own, or deeper for a bullet or field); every line
    that must stay as written is a group of its own."""
    groups: list[tuple[bool, list[int]]] = []
    literal_above: int | None = None  # indentation of the paragraph that ended with "::"
    in_doctest = in_table = in_fence = False
    current: list[int] = []
    hang: int | None = None

    def close() -> None:
        nonlocal current, hang
        if current:
            groups.append((True, current))
        current, hang = [], None

    for i, line in enumerate(lines):
        text = line.text
        if not text:
            close()
            in_doctest = in_table = False
            groups.append((False, [i]))
            continue
        if literal_above is not None and line.indent > literal_above:
            close()
            groups.append((False, [i]))
            continue
        literal_above = None
        if text.startswith("```"):
            in_fence = not in_fence
        in_doctest = in_doctest or text.startswith(">>>")  # its output lines follow, up to a blank
        in_table = (
            in_table or bool(RST_TABLE_RULE.match(text)) or text.startswith(("|", "+-", "+="))
        )
        if in_fence or in_doctest or in_table or _verbatim(text):
            close()
            groups.append((False, [i]))
        else:
            if current and _continues([lines[n] for n in current], line, hang):
                current.append(i)
                hang = line.indent
            else:
                close()
                current = [i]
        if _strip_quotes(text).endswith("::"):
            close()
            literal_above = line.indent
    close()
    return groups


def _verbatim(text: str) -> bool:
    """A line kept as written whatever surrounds it: a fence, a directive, aligned columns, a
    divider, a docstring's opening or closing quotes alone."""
    return (
        text.startswith(("```", ".."))
        or bool(ALIGNED.search(text))
        or bool(DIVIDER.match(text))
        or text in ('"""', "'''")
    )


def _continues(paragraph: list[Line], line: Line, hang: int | None) -> bool:
    """Whether ``line`` goes on ``paragraph``: it starts nothing of its own (a bullet, a field), the
    line before it heads nothing ("Args:"), and it has the paragraph's indentation: the first
    line's, or (a bullet's or field's hanging indent) a deeper one, the same for every later
    line."""
    first = paragraph[0]
    if BULLET.match(line.text) or FIELD.match(line.text) or HEADER.match(paragraph[-1].text):
        return False
    if hang is not None:
        return line.indent == hang
    hangs = bool(BULLET.match(first.text) or FIELD.match(first.text))
    return line.indent == first.indent or (line.indent > first.indent and hangs)


def _strip_quotes(text: str) -> str:
    return text[:-3].rstrip() if text.endswith(('"""', "'''")) else text


def _hanging_indent(lines: list[Line], group: list[int], base: int) -> int:
    """The indentation of a paragraph's second and later lines once re-wrapped (``base``: the
    text's own indentation; a field deeper than it hangs by 4 more)."""
    first = lines[group[0]]
    if len(group) > 1:
        return lines[group[1]].indent
    bullet = BULLET.match(first.text)
    if bullet:
        return first.indent + bullet.end()
    return first.indent + 4 if FIELD.match(first.text) and first.indent > base else first.indent


def _glued_words(text: str) -> list[str]:
    """The words of a paragraph, a markup-looking word glued to the one before it (so no line starts
    with ``-`` or ``>>>`` after wrapping)."""
    words: list[str] = []
    for word in text.split():
        if words and MARKUP_WORD.match(word):
            words[-1] += GLUE + word
        else:
            words.append(word)
    return words


def _wrap_paragraph(lines: list[Line], group: list[int], width: int, base: int) -> list[str]:
    """The paragraph's lines re-wrapped to ``width`` characters (indentation included)."""
    first = lines[group[0]]
    words = _glued_words(" ".join(lines[i].text for i in group))
    wrapper = textwrap.TextWrapper(width=width, initial_indent=" " * first.indent,
                                   subsequent_indent=" " * _hanging_indent(lines, group, base),
                                   break_long_words=False, break_on_hyphens=False)
    return [row.replace(GLUE, " ") for row in wrapper.wrap(" ".join(words))]


def rewrap_text(lines: list[Line], width: int) -> list[str] | None:
    """``lines`` with each paragraph holding a line over ``width`` re-wrapped (others as written),
    or ``None`` when nothing needed re-wrapping."""
    out: list[str] = []
    changed = False
    base = min((line.indent for line in lines[1:] if line.text), default=lines[0].indent)
    for reflowable, group in _split_paragraphs(lines):
        written = [" " * lines[i].indent + lines[i].text if lines[i].text else "" for i in group]
        if reflowable and any(len(row) > width for row in written):
            wrapped = _wrap_paragraph(lines, group, width, base)
            changed = changed or wrapped != written
            out.extend(wrapped)
        else:
            out.extend(written)
    return out if changed else None


def _as_lines(rows: list[str]) -> list[Line]:
    return [Line(len(row) - len(row.lstrip(" ")), row.strip()) for row in rows]


# ---------------------------------------------------------------- pass 1 and 2: comments


def _tokens(source: str) -> list[tokenize.TokenInfo]:
    return list(tokenize.generate_tokens(io.StringIO(source).readline))


def _line_starts_in_string(tokens: list[tokenize.TokenInfo]) -> set[int]:
    """Line numbers (1-based) that begin inside a multi-line string or after a backslash: nothing
    may be put above them."""
    inside: set[int] = set()
    for tok in tokens:
        if tok.type == tokenize.STRING and tok.end[0] > tok.start[0]:
            inside.update(range(tok.start[0] + 1, tok.end[0] + 1))
    return inside


def _comment_rows(text: str, indent: int, width: int) -> list[str]:
    """A comment's text as ``# ...`` lines at ``indent`` spaces, wrapped to ``width``."""
    body = re.sub(r"^#+:?\s?", "", text).strip()
    wrapper = textwrap.TextWrapper(width=width, initial_indent=" " * indent + "# ",
                                   subsequent_indent=" " * indent + "# ", break_long_words=False,
                                   break_on_hyphens=False)
    return [row.replace(GLUE, " ") for row in wrapper.wrap(" ".join(_glued_words(body)))]


def move_trailing_comments(source: str, width: int) -> str:
    """Pass 1: a trailing comment on a too-long line moves onto its own lines just above the
    code."""
    rows = source.splitlines(keepends=True)
    tokens = _tokens(source)
    blocked = _line_starts_in_string(tokens)
    for tok in reversed(tokens):
        if tok.type != tokenize.COMMENT:
            continue
        number = tok.start[0]
        row = rows[number - 1].rstrip("\n")
        if len(row) <= width or not row[: tok.start[1]].strip():
            continue
        prev = rows[number - 2].rstrip("\n") if number > 1 else ""
        if number in blocked or prev.endswith("\\"):
            continue
        comment = tok.string
        pragma = PRAGMA.match(comment)
        keep = ""
        if pragma:
            keep, comment = pragma.group(0), comment[pragma.end():].strip(" -;:")
            if not comment:
                continue
        code = row[: tok.start[1]].rstrip()
        indent = len(row) - len(row.lstrip(" "))
        above = _comment_rows(comment, indent, width)
        rows[number - 1 : number] = [r + "\n" for r in above] + [
            code + (f"  {keep}" if keep else "") + "\n"
        ]
    return "".join(rows)


def _shorten_divider(row: str, width: int) -> str:
    """A too-long divider comment line with its run of dashes shortened to fit (at least 10
    kept)."""
    text = row.rstrip("\n")
    column = len(text) - len(text.lstrip(" "))
    body = text[column:].lstrip("#").lstrip(" ")
    run = DIVIDER.match(body)
    if len(text) <= width or run is None:
        return row
    keep = max(10, run.end() - (len(text) - width))
    at = len(text) - len(body)
    return text[:at] + body[0] * keep + body[run.end():] + row[len(text):]


def rewrap_comment_blocks(source: str, width: int) -> str:
    """Pass 2: runs of whole-line comments in one column re-wrapped by paragraph."""
    rows = source.splitlines(keepends=True)
    tokens = _tokens(source)
    own = {}  # line number -> column, for a comment alone on its line
    for tok in tokens:
        if tok.type == tokenize.COMMENT and not rows[tok.start[0] - 1][: tok.start[1]].strip():
            own[tok.start[0]] = tok.start[1]
    blocks: list[list[int]] = []
    for number in sorted(own):
        text = rows[number - 1].strip()
        if text.startswith(("#!", "# -*-")) or (number == 1 and "coding" in text):
            continue
        if blocks and blocks[-1][-1] == number - 1 and own[blocks[-1][-1]] == own[number]:
            blocks[-1].append(number)
        else:
            blocks.append([number])
    for block in reversed(blocks):
        column = own[block[0]]
        if not any(len(rows[n - 1].rstrip("\n")) > width for n in block):
            continue
        for n in block:
            rows[n - 1] = _shorten_divider(rows[n - 1], width)
        if not any(len(rows[n - 1].rstrip("\n")) > width for n in block):
            continue
        marker = re.match(r"#+:?", rows[block[0] - 1].strip()).group(0)
        prefix = " " * column + marker + " "
        bodies = []
        for n in block:
            body = rows[n - 1].strip()[len(marker):]
            bodies.append(body[1:] if body.startswith(" ") else body)
        wrapped = rewrap_text(_as_lines(bodies), width - len(prefix))
        if wrapped is not None:
            rows[block[0] - 1: block[-1]] = [(prefix + r).rstrip() + "\n" for r in wrapped]
    return "".join(rows)


# ---------------------------------------------------------------- pass 3: docstrings


def docstring_nodes(tree: ast.AST) -> list[ast.Constant]:
    """The docstrings of a module, its classes and functions, and every other string standing alone
    as a statement (an attribute's docstring: its value is never used), as ``Constant`` nodes."""
    return [node.value for node in ast.walk(tree) if isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)]


def _char_column(row: str, byte_column: int) -> int:
    """``ast`` counts columns in UTF-8 bytes, ``tokenize`` in characters."""
    return len(row.encode("utf-8")[:byte_column].decode("utf-8", errors="ignore"))


def _joins_lines(row: str) -> bool:
    """A line ending in an odd number of backslashes: inside a string, the next line joins it."""
    return (len(row) - len(row.rstrip("\\"))) % 2 == 1


def rewrap_docstrings(source: str, width: int) -> str:
    """Pass 3: the paragraphs of a docstring that hold a too-long line, re-wrapped."""
    rows = source.splitlines(keepends=True)
    strings = {tok.start: tok for tok in _tokens(source) if tok.type == tokenize.STRING}
    for node in sorted(docstring_nodes(ast.parse(source)), key=lambda n: -n.lineno):
        first, last = node.lineno - 1, node.end_lineno - 1
        column = _char_column(rows[first], node.col_offset)
        tok = strings.get((node.lineno, column))
        if tok is None or tok.end != (
            node.end_lineno,
            _char_column(rows[last], node.end_col_offset),
        ):
            continue  # adjacent literals: not one token
        span = [rows[n].rstrip("\n") for n in range(first, last + 1)]
        if not any(len(r) > width for r in span):
            continue
        raw = "r" in tok.string[: tok.string.index(tok.string[-1])].lower()
        if not raw and any(_joins_lines(r) for r in span):
            continue
        before = rows[first][:column]
        lines = _as_lines([" " * column + span[0][column:], *span[1:]])
        wrapped = rewrap_text(lines, width)
        if wrapped is None:
            continue
        wrapped[0] = before + wrapped[0][column:]
        tail = rows[last][len(span[-1]):]  # the newline
        rows[first: last + 1] = [r + "\n" for r in wrapped[:-1]] + [wrapped[-1] + tail]
    return "".join(rows)


# ---------------------------------------------------------------- pass 4 and 5: code


def _ruff_range(source: str, path: Path, number: int, width: int) -> str:
    """``source`` with the statement holding line ``number`` formatted by ruff."""
    length = len(source.splitlines()[number - 1])
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            "format",
            f"--line-length={width}",
            f"--range={number}:1-{number}:{length + 1}",
            "--stdin-filename",
            str(path),
            "-",
        ],
        input=source,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"ruff format failed on {path}:{number}: {done.stderr.strip()}")
    return done.stdout


def _text_lines(source: str) -> set[int]:
    """Lines (1-based) that are docstring lines or whole-line comments: not code for ruff."""
    rows = source.splitlines()
    lines = set()
    for node in docstring_nodes(ast.parse(source)):
        lines.update(range(node.lineno, node.end_lineno + 1))
    for tok in _tokens(source):
        if tok.type == tokenize.COMMENT and not rows[tok.start[0] - 1][: tok.start[1]].strip():
            lines.add(tok.start[0])
    return lines


def _long_code_lines(source: str, width: int) -> list[int]:
    text = _text_lines(source)
    return [n for n, row in enumerate(source.splitlines(), 1) if len(row) > width and n not in text]


def format_code(source: str, path: Path, width: int) -> str:
    """Pass 4: each statement holding a too-long code line formatted by ruff, last line first (a
    statement formatted below leaves every line number above it as it was)."""
    below = sys.maxsize
    while True:
        todo = [n for n in _long_code_lines(source, width) if n < below]
        if not todo:
            return source
        below = todo[-1]
        source = _ruff_range(source, path, below, width)


def _split_points(body: str, is_f: bool) -> list[int]:
    """Indexes in a string literal's body where it may be cut: after a space outside an f-string's
    replacement fields, or between two fields."""
    points, depth, i = [], 0, 0
    while i < len(body):
        ch = body[i]
        if is_f and body.startswith(("{{", "}}"), i) and depth == 0:
            i += 2
            continue
        if is_f and ch == "{":
            depth += 1
        elif is_f and ch == "}":
            depth -= 1
            if depth == 0 and body.startswith("{", i + 1):
                points.append(i + 1)  # between two replacement fields
        elif ch == " " and depth == 0 and 0 < i < len(body) - 1:
            points.append(i + 1)
        i += 1
    return points


def split_literal(token: str, room: int) -> str | None:
    """A one-line string literal as adjacent literals, each at most ``room`` characters, cut after a
    space; ``None`` when it cannot be cut."""
    quote_at = min(i for i in (token.find('"'), token.find("'")) if i >= 0)
    prefix, quote = token[:quote_at], token[quote_at]
    if token[quote_at: quote_at + 3] == quote * 3 or "\\N{" in token:
        return None
    body = token[quote_at + 1: -1]
    points = _split_points(body, "f" in prefix.lower())
    overhead = len(prefix) + 2
    parts, start = [], 0
    while len(body) - start + overhead > room:
        fitting = [p for p in points if start < p and p - start + overhead <= room]
        cut = fitting[-1] if fitting else next((p for p in points if p > start), None)
        if cut is None:
            break
        parts.append(body[start:cut])
        start = cut
    if not parts:
        return None
    parts.append(body[start:])
    return " ".join(f"{prefix}{quote}{part}{quote}" for part in parts)


def split_long_strings(source: str, path: Path, width: int) -> str:
    """Pass 5: in a code line still too long, the longest one-line string literal is cut into
    adjacent literals and the statement formatted again (ruff puts one literal on each line)."""
    for room_cut in (8, 16, 24):
        below = sys.maxsize
        while True:
            todo = [n for n in _long_code_lines(source, width) if n < below]
            if not todo:
                break
            below = number = todo[-1]
            row = source.splitlines()[number - 1]
            candidates = [t for t in _tokens(source) if t.type == tokenize.STRING
                          and t.start[0] == t.end[0] == number]
            if not candidates:
                continue
            tok = max(candidates, key=lambda t: len(t.string))
            indent = len(row) - len(row.lstrip(" "))
            pieces = split_literal(tok.string, width - indent - room_cut)
            if pieces is None:
                continue
            rows = source.splitlines(keepends=True)
            rows[number - 1] = row[: tok.start[1]] + pieces + rows[number - 1][tok.end[1]:]
            candidate = _ruff_range("".join(rows), path, number, width)
            if _same_tree(source, candidate):
                source = candidate
    return source


# ---------------------------------------------------------------- the safety check


def tree_dump(source: str) -> str:
    """The syntax tree of ``source`` as text, each docstring's whitespace collapsed to one space."""
    tree = ast.parse(source)
    for node in docstring_nodes(tree):
        node.value = " ".join(node.value.split())
    return ast.dump(tree, include_attributes=False)


def _same_tree(before: str, after: str) -> bool:
    try:
        return tree_dump(before) == tree_dump(after)
    except SyntaxError:
        return False


def wrap_source(source: str, path: Path, width: int = WIDTH) -> str:
    """``source`` with every line it can break made at most ``width`` characters."""
    text = move_trailing_comments(source, width)
    text = rewrap_comment_blocks(text, width)
    text = rewrap_docstrings(text, width)
    text = format_code(text, path, width)
    return split_long_strings(text, path, width)


# ---------------------------------------------------------------- what stays long


def why_long(source: str, number: int) -> str:
    """Why line ``number`` of ``source`` is still too long, in a few words."""
    if number in {n for node in docstring_nodes(ast.parse(source))
                  for n in range(node.lineno, node.end_lineno + 1)}:
        return "docstring: table, aligned columns, literal block or an unbreakable word"
    for tok in _tokens(source):
        if tok.start[0] <= number <= tok.end[0]:
            if tok.type == tokenize.COMMENT:
                return "comment: an unbreakable word"
            if tok.type == tokenize.STRING and tok.end[0] > tok.start[0]:
                return "inside a multi-line string (its value)"
    return "code ruff could not break"


def python_files(paths: list[str]) -> list[Path]:
    found: list[Path] = []
    for name in paths:
        path = Path(name)
        found.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    return found


def long_lines(files: list[Path], width: int) -> list[tuple[Path, int, str, str]]:
    """``(path, line number, line, why)`` for every line over ``width`` characters."""
    found = []
    for path in files:
        source = path.read_text(encoding="utf-8")
        for number, row in enumerate(source.splitlines(), 1):
            if len(row) > width:
                found.append((path, number, row, why_long(source, number)))
    return found


def _relative(path: Path) -> str:
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return path.as_posix()


def check_ast(files: list[Path], revision: str) -> list[str]:
    """Files whose tree differs from the same file at git ``revision`` (docstring whitespace
    aside)."""
    differ = []
    for path in files:
        shown = subprocess.run(
            ["git", "show", f"{revision}:{_relative(path)}"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=False,
        )
        if shown.returncode != 0:
            continue  # new at this revision: nothing to compare with
        if not _same_tree(shown.stdout, path.read_text(encoding="utf-8")):
            differ.append(_relative(path))
    return differ


def rewrite(files: list[Path], width: int) -> tuple[int, list[str]]:
    """Rewrite ``files`` in place; the number changed and the files left alone (tree would
    change)."""
    changed, refused = 0, []
    for path in files:
        source = path.read_text(encoding="utf-8")
        if all(len(row) <= width for row in source.splitlines()):
            continue
        wrapped = wrap_source(source, path, width)
        if wrapped == source:
            continue
        if not _same_tree(source, wrapped):
            refused.append(_relative(path))
            continue
        path.write_text(wrapped, encoding="utf-8")
        changed += 1
    return changed, refused


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="files or folders (every .py file under them)")
    parser.add_argument("--width", type=int, default=WIDTH, help="the most characters on a line")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--check-ast", metavar="REV", help="compare each file's tree with git REV's; change nothing"
    )
    mode.add_argument(
        "--list", action="store_true", help="list the lines over --width; change nothing"
    )
    mode.add_argument(
        "--write-allow-list", metavar="FILE", help="write the lines over --width to FILE"
    )
    args = parser.parse_args(argv)
    files = python_files(args.paths)
    if args.check_ast:
        differ = check_ast(files, args.check_ast)
        print(f"{len(files) - len(differ)} of {len(files)} files: same tree as {args.check_ast}")
        for name in differ:
            print(f"tree changed: {name}")
        return 1 if differ else 0
    if args.write_allow_list:
        rows = sorted(
            {f"{_relative(p)}\t{row.strip()}" for p, _, row, _ in long_lines(files, args.width)}
        )
        Path(args.write_allow_list).write_text("".join(r + "\n" for r in rows), encoding="utf-8")
        print(f"{len(rows)} lines over {args.width} characters written to {args.write_allow_list}")
        return 0
    if not args.list:
        changed, refused = rewrite(files, args.width)
        print(f"{changed} of {len(files)} files rewritten")
        for name in refused:
            print(f"left as it was (its tree would change): {name}")
    remaining = long_lines(files, args.width)
    for path, number, row, why in remaining:
        print(f"{_relative(path)}:{number}: {len(row)} characters: {why}")
    print(f"{len(remaining)} lines over {args.width} characters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
