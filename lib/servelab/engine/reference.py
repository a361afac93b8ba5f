"""The plain full-recompute decoding loop: no KV cache, no batching, no scheduler.

Every step runs the whole sequence so far through the model with dense causal attention and takes
the logits of the last position. It is slow (quadratic work per token) and obviously correct, which
is why the engine's tests compare against it token for token under greedy decoding.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from servelab.model.llama import DenseCausalAttention, LlamaForCausalLM


@torch.inference_mode()
def reference_generate(model: LlamaForCausalLM, prompt_ids: Sequence[int], max_tokens: int,
                       eos_token_id: int | None = None) -> list[int]:
    """Greedy: up to ``max_tokens`` token ids after ``prompt_ids``, recomputing everything each
    step.

    Each step takes the argmax of the last position's logits (lowest id on a tie). Generation stops
    after ``eos_token_id`` (included in the output) or after ``max_tokens`` tokens.
    """
    if not prompt_ids:
        raise ValueError("prompt_ids must contain at least one token")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    device = next(model.parameters()).device
    ids = list(prompt_ids)
    out: list[int] = []
    backend = DenseCausalAttention()
    for _ in range(max_tokens):
        tokens = torch.tensor([ids], device=device)
        positions = torch.arange(len(ids), device=device)[None]
        hidden = model.hidden_states(tokens, positions, backend)[0, -1]
        token = int(torch.argmax(model.lm_head(hidden).float()))
        out.append(token)
        ids.append(token)
        if token == eos_token_id:
            break
    return out
