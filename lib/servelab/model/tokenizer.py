"""Byte-level BPE tokenizer for the course model, built with Hugging Face ``tokenizers``.

Byte-level means every UTF-8 byte has a token, so any string round-trips exactly; BPE then merges
frequent byte pairs until the vocabulary holds ``vocab_size`` entries. One special token,
``<|endoftext|>`` (id 0), separates documents and serves as both BOS and EOS id in ``config.json``.

System boundary: ``str`` in, token ids (``list[int]``) out, via a ``tokenizers.Tokenizer``. The
shipped file is ``assets/shakespeare/tokenizer.json``; any HF model folder with a ``tokenizer.json``
works too.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from servelab.model.checkpoint import default_model_dir

END_OF_TEXT = "<|endoftext|>"
DEFAULT_VOCAB_SIZE = 2048
_MIN_VOCAB_SIZE = 256 + 1  # every byte, plus the end-of-text token


def train_tokenizer(text: str, vocab_size: int = DEFAULT_VOCAB_SIZE) -> Tokenizer:
    """Train a byte-level BPE with ``vocab_size`` entries (including ``<|endoftext|>`` at id 0)."""
    if not isinstance(text, str) or not text:
        raise ValueError("text must be a non-empty str")
    if not isinstance(vocab_size, int) or vocab_size < _MIN_VOCAB_SIZE:
        raise ValueError(f"vocab_size must be an int >= {_MIN_VOCAB_SIZE}, got {vocab_size!r}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(_chunks(text), trainer=trainer)
    return tokenizer


def _chunks(text: str, size: int = 1 << 20) -> Iterator[str]:
    """Feed the trainer ~1 MB pieces, cut at newlines, so it never holds one giant string."""
    start = 0
    while start < len(text):
        end = text.find("\n", start + size)
        end = len(text) if end < 0 else end + 1
        yield text[start:end]
        start = end


def end_of_text_id(tokenizer: Tokenizer) -> int:
    """The id of ``<|endoftext|>``; ValueError if the tokenizer has no such token."""
    token_id = tokenizer.token_to_id(END_OF_TEXT)
    if token_id is None:
        raise ValueError(f"tokenizer has no {END_OF_TEXT!r} token")
    return token_id


def chars_per_token(tokenizer: Tokenizer, text: str) -> float:
    """Compression: characters of ``text`` per token (higher means fewer tokens per character)."""
    if not text:
        raise ValueError("text must be non-empty")
    return len(text) / len(tokenizer.encode(text).ids)


def load_tokenizer(path: str | Path | None = None) -> Tokenizer:
    """Load a ``tokenizer.json``: ``path`` is the file or a model folder holding it.

    Default: the shipped Shakespeare tokenizer.
    """
    if path is None:
        path = default_model_dir()
    if not isinstance(path, (str, Path)):
        raise TypeError(f"path must be a str, Path or None, got {type(path).__name__}")
    path = Path(path)
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise ValueError(f"path has no tokenizer.json: {file}")
    return Tokenizer.from_file(str(file))
