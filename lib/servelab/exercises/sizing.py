"""Checker for the KV sizing and capacity exercise.

Student signatures (integers in, an integer out; bytes and token slots)::

    def kv_bytes_per_token(n_layer: int, n_head: int, n_kv_head: int, d_head: int,
                           bytes_per_elem: int) -> int: ...
    def max_requests(pool_bytes: int, bytes_per_token: int, block_size: int,
                     prompt_tokens: int, max_output_tokens: int) -> int: ...

``kv_bytes_per_token`` is the K and V payload of one token over every layer; ``n_head`` (query
heads) is given so that a grouped-query model can be sized wrongly. ``max_requests`` is how many
requests a KV pool of ``pool_bytes`` can hold at once when each reserves whole blocks for its prompt
*and* its whole output allowance, and the pool itself is cut into whole blocks. The reference is
``servelab.kv.kv_bytes_per_token`` and ``servelab.kv.physical_blocks_no_sharing``; the public cases'
expected values are committed data (:mod:`servelab.exercises.expected`).
"""

from __future__ import annotations

from collections.abc import Callable

from servelab.exercises.expected import paired, public_expected, reference
from servelab.exercises.hidden import hidden_rng
from servelab.exercises.result import Case, CaseFailure, CheckResult, run_cases
from servelab.prose import count

__all__ = ["check_kv_sizing", "expected_from_reference"]

GIB = 2**30

# (rule, arguments (n_layer, n_head, n_kv_head, d_head, bytes_per_elem), points)
BYTES_CASES = (
    ("K and V both count: 2 x layers x KV heads x head dim x bytes", (2, 2, 2, 4, 2), 1),
    ("grouped-query attention: only the KV heads are cached", (32, 32, 8, 128, 2), 2),
    ("the element width sets the bytes (fp32 = 4, int8 = 1)", (24, 16, 16, 64, 1), 1),
)

# (rule, arguments (pool_bytes, bytes_per_token, block_size, prompt_tokens, max_output_tokens),
# points)
CAPACITY_CASES = (
    ("every request reserves its prompt plus its whole output allowance",
     (64 * 16 * 1024, 1024, 16, 100, 156), 2),
    ("a request reserves whole blocks (ceiling)", (10 * 16 * 2048, 2048, 16, 17, 0), 1),
    ("the pool holds whole blocks only (floor)", (10 * 16 * 2048 + 2047, 2048, 16, 16, 16), 1),
    ("an 8B-class model on a 16 GiB pool", (16 * GIB, 131072, 16, 1000, 500), 2),
)

BYTES_NAMES = ("n_layer", "n_head", "n_kv_head", "d_head", "bytes_per_elem")
CAPACITY_NAMES = (
    "pool_bytes",
    "bytes_per_token",
    "block_size",
    "prompt_tokens",
    "max_output_tokens",
)


def hidden_cases(seed: int) -> tuple[tuple, tuple]:
    """``(bytes cases, capacity cases)`` for ``seed``: new model shapes and pools, one per public
    rule.

    Multi-head models for the first and third rules, a grouped-query model (KV heads a proper
    divisor of the query heads) for the second; for capacity, a pool of whole blocks with a large
    output allowance, a prompt one token past a block boundary with no output, a pool with a partial
    block left over, and a 16 GiB pool with a grouped-query 8B-class model.
    """
    rng = hidden_rng(seed, "kv_sizing")
    heads = rng.choice((4, 8, 12, 16))
    gqa_heads = rng.choice((16, 32, 64))
    model = (
        rng.choice((28, 40, 48)),
        gqa_heads,
        gqa_heads // rng.choice((2, 4, 8)),
        rng.choice((64, 128)),
        2,
    )
    bytes_cases = (
        (
            BYTES_CASES[0][0],
            (rng.randint(2, 12), heads, heads, rng.choice((16, 32, 64)), 2),
            BYTES_CASES[0][2],
        ),
        (BYTES_CASES[1][0], model, BYTES_CASES[1][2]),
        (
            BYTES_CASES[2][0],
            (rng.randint(12, 48), heads, heads, rng.choice((32, 128)), rng.choice((1, 4))),
            BYTES_CASES[2][2],
        ),
    )
    block, per_token = rng.choice((8, 16, 32)), rng.choice((512, 1024, 4096))
    blocks, prompt = rng.randint(40, 120), rng.randint(20, 200)
    per_8b = 2 * model[0] * model[2] * model[3] * model[4]
    capacity_cases = (
        (
            CAPACITY_CASES[0][0],
            (blocks * block * per_token, per_token, block, prompt, rng.randint(100, 400)),
            CAPACITY_CASES[0][2],
        ),
        (
            CAPACITY_CASES[1][0],
            (blocks * block * per_token, per_token, block, rng.randint(1, 4) * block + 1, 0),
            CAPACITY_CASES[1][2],
        ),
        (
            CAPACITY_CASES[2][0],
            (
                blocks * block * per_token + rng.randint(1, block * per_token - 1),
                per_token,
                block,
                block,
                block,
            ),
            CAPACITY_CASES[2][2],
        ),
        (
            CAPACITY_CASES[3][0],
            (16 * GIB, per_8b, 16, rng.randint(500, 2000), rng.randint(200, 1000)),
            CAPACITY_CASES[3][2],
        ),
    )
    return bytes_cases, capacity_cases


def expected_from_reference(bytes_cases: tuple, capacity_cases: tuple) -> dict[str, list[int]]:
    """The reference's answers to both tables: ``{"bytes": [...], "capacity": [...]}``."""
    ref = reference()
    return {"bytes": [ref.reference_kv_bytes_per_token(*args) for _, args, _ in bytes_cases],
            "capacity": [ref.reference_max_requests(*args) for _, args, _ in capacity_cases]}


def _tables(seed: int | None) -> tuple[list[tuple], list[tuple]]:
    """The bytes and capacity cases of ``seed`` (public when None), each paired with its expected
    value."""
    tables = (BYTES_CASES, CAPACITY_CASES) if seed is None else hidden_cases(seed)
    values = public_expected("kv_sizing") if seed is None else expected_from_reference(*tables)
    return paired("kv_sizing", tables[0], values["bytes"]), paired(
        "kv_sizing", tables[1], values["capacity"]
    )


def _call(name: str, names: tuple[str, ...], args: tuple) -> str:
    return f"{name}({', '.join(f'{n}={v}' for n, v in zip(names, args))})"


def _bytes_case(fn: Callable[..., int], args: tuple, expected: int) -> None:
    got = fn(*args)
    if got != expected:
        n_layer, n_head, n_kv_head, d_head, width = args
        hint = ""
        if got == 2 * n_layer * n_head * d_head * width and n_head != n_kv_head:
            hint = " (that counts the query heads; the cache holds K and V of the KV heads only)"
        elif got * 2 == expected:
            hint = " (half: K and V are both cached)"
        raise CaseFailure(f"{_call('kv_bytes_per_token', BYTES_NAMES, args)} returned {got!r}, "
                          f"expected {expected} bytes{hint}")


def _capacity_case(fn: Callable[..., int], args: tuple, expected: int) -> None:
    got = fn(*args)
    if got != expected:
        pool_bytes, per_token, block, prompt, output = args
        blocks = pool_bytes // (block * per_token)
        need = -(-(prompt + output) // block)
        raise CaseFailure(
            f"{_call('max_requests', CAPACITY_NAMES, args)} returned {got!r}, expected {expected}\n"
            f"steps: the pool holds {pool_bytes} // ({block} x {per_token}) = {blocks} "
            f"whole blocks; "
            f"one request reserves ceil(({prompt} + {output}) / {block}) = {count(need, 'block')}; "
            f"{blocks} // {need} = {expected}"
        )


def check_kv_sizing(kv_bytes_per_token: Callable[..., int], max_requests: Callable[..., int],
                    verbose: bool = True, seed: int | None = None) -> CheckResult:
    """Run the sizing cases (public, or the hidden ones of ``seed``): bytes per token, then requests
    per pool."""
    bytes_table, capacity_table = _tables(seed)
    cases = [Case(rule, lambda a=args, e=expected: _bytes_case(kv_bytes_per_token, a, e), points)
             for (rule, args, points), expected in bytes_table]
    cases += [Case(rule, lambda a=args, e=expected: _capacity_case(max_requests, a, e), points)
              for (rule, args, points), expected in capacity_table]
    return run_cases("KV sizing and capacity", cases, verbose)


def worked_example() -> str:
    """The 8B-class model (public cases): bytes per token, then requests on a 16 GiB pool."""
    (_, model, _), per_token = _tables(None)[0][1]
    (_, pool, _), requests = _tables(None)[1][3]
    return (
        f"{_call('kv_bytes_per_token', BYTES_NAMES, model)} -> {per_token} bytes "
        f"({per_token // 1024} KiB)\n"
        f"{_call('max_requests', CAPACITY_NAMES, pool)} -> {requests} requests"
    )
