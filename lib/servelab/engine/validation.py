"""Request validation: everything ``LLMEngine.add_request`` checks before a request exists.

A request is rejected (TypeError / ValueError naming the parameter) before it gets an id, a
lifecycle or any resource: a prompt that is empty, outside the vocabulary or leaves no room under
``max_model_len``; sampling parameters naming unknown token ids or needing more batch slots or KV
blocks than the engine has; a bad deadline, namespace, priority or request id.

System boundary: pure checks over the engine's fixed limits; nothing here touches the scheduler.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from servelab._validate import require_int, require_real, require_type
from servelab.engine.config import EngineConfig
from servelab.engine.admission import ReservationPolicy
from servelab.model.llama import LlamaForCausalLM
from servelab.sampling.params import SamplingParams


def check_components(model: LlamaForCausalLM, tokenizer, config: EngineConfig) -> EngineConfig:
    """The engine's parts have the right types: a servelab Llama, a tokenizer with encode/decode, a
    config."""
    if not isinstance(model, LlamaForCausalLM):
        raise TypeError(f"model must be a servelab LlamaForCausalLM, got {type(model).__name__}")
    for name in ("encode", "decode"):
        if not callable(getattr(tokenizer, name, None)):
            raise TypeError(f"tokenizer must have encode() and decode() (a tokenizers.Tokenizer), "
                            f"got {type(tokenizer).__name__}")
    return require_type("config", config, EngineConfig)


def context_limit(model: LlamaForCausalLM, config: EngineConfig) -> int:
    """The engine's ``max_model_len`` (tokens): the configured one, at most the model's
    positions."""
    limit = model.config.max_position_embeddings
    max_len = config.max_model_len or limit
    if max_len > limit:
        raise ValueError(
            f"max_model_len must be <= the model's max_position_embeddings ({limit}), got {max_len}"
        )
    if not config.enable_chunked_prefill and config.max_num_batched_tokens < max_len:
        raise ValueError(
            f"with chunked prefill off, max_num_batched_tokens "
            f"({config.max_num_batched_tokens}) must be >= "
            f"max_model_len ({max_len}) so that any prompt fits one iteration"
        )
    return max_len


class RequestValidator:
    """Checks one engine's requests against its tokenizer, vocabulary, context limit and KV pool."""

    def __init__(
        self,
        tokenizer,
        vocab_size: int,
        max_model_len: int,
        config: EngineConfig,
        num_blocks: int,
        reservation: ReservationPolicy,
    ) -> None:
        self.tokenizer, self.vocab_size, self.max_model_len = tokenizer, vocab_size, max_model_len
        self.config, self.num_blocks, self.reservation = config, num_blocks, reservation
        self._auto_ids = itertools.count()

    def prompt_ids(self, prompt: str | list[int]) -> list[int]:
        """The prompt as token ids: text is encoded, ids are checked against the vocabulary."""
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt).ids
        elif isinstance(prompt, (list, tuple)):
            ids = list(prompt)
            for token in ids:
                require_type("prompt token ids", token, int)
                if not 0 <= token < self.vocab_size:
                    raise ValueError(
                        f"prompt token id {token} is outside the vocabulary [0, "
                        f"{self.vocab_size - 1}]"
                    )
        else:
            raise TypeError(
                f"prompt must be a str or a list of token ids, got {type(prompt).__name__}"
            )
        if not ids:
            raise ValueError("prompt must contain at least one token, got an empty prompt")
        if len(ids) >= self.max_model_len:
            raise ValueError(
                f"prompt has {len(ids)} tokens; the context limit "
                f"max_model_len={self.max_model_len} "
                "leaves no room for a generated token"
            )
        return ids

    def check_params(self, params: SamplingParams, prompt_ids: list[int]) -> None:
        """Sampling parameters this engine can serve for this prompt (slots, vocabulary, KV
        blocks)."""
        require_type("params", params, SamplingParams)
        if params.n > self.config.max_num_seqs:
            raise ValueError(
                f"params.n={params.n} samples need as many batch slots at once, but "
                f"max_num_seqs is "
                f"{self.config.max_num_seqs}; lower n or raise max_num_seqs"
            )
        named = [*(t for t, _ in params.logit_bias), *(params.allowed_token_ids or ()),
                 *(t for seq in params.banned_sequences for t in seq)]
        bad = [t for t in named if t >= self.vocab_size]
        if bad:
            raise ValueError(
                f"params name token ids outside the vocabulary [0, {self.vocab_size - 1}]: "
                f"{bad[:5]}"
            )
        blocks = self.reservation.worst_case_blocks(len(prompt_ids), params.max_tokens, params.n)
        if blocks > self.num_blocks:
            raise ValueError(f"prompt + max_tokens needs up to {blocks} KV blocks but the pool has "
                             f"{self.num_blocks}; lower max_tokens or enlarge num_blocks")

    @staticmethod
    def check_options(
        deadline_s: float | None, namespace: str, priority: int, tenant: str = ""
    ) -> None:
        """``deadline_s`` positive seconds or None, ``namespace`` and ``tenant`` strs, ``priority``
        an int."""
        if deadline_s is not None:
            require_real("deadline_s", deadline_s, 0, strict_min=True)
        require_type("namespace", namespace, str)
        require_int("priority", priority)
        require_type("tenant", tenant, str)

    def request_id(self, request_id: str | None, in_use: Callable[[str], bool]) -> str:
        """The caller's id after checks, or a fresh ``req-N`` id."""
        if request_id is None:
            request_id = f"req-{next(self._auto_ids)}"
            while in_use(request_id):
                request_id = f"req-{next(self._auto_ids)}"
            return request_id
        if not isinstance(request_id, str) or not request_id:
            raise TypeError(f"request_id must be a non-empty str or None, got {request_id!r}")
        if in_use(request_id):
            raise ValueError(f"request_id {request_id!r} is already in use")
        return request_id

    @staticmethod
    def sample_ids(request_id: str, n: int, in_use: Callable[[str], bool]) -> list[str]:
        """Sequence ids of a request's ``n`` samples: the request id, then ``<request_id>/<i>``."""
        ids = [request_id] + [f"{request_id}/{i}" for i in range(1, n)]
        taken = [seq_id for seq_id in ids[1:] if in_use(seq_id)]
        if taken:
            raise ValueError(
                f"sample sequence ids {taken} of request {request_id!r} are already in use"
            )
        return ids
