"""The up-front admission rule, and the rule ``EngineConfig.reservation_policy`` names.

The scheduler holds one :class:`~servelab.engine.scheduler.ReservationPolicy`; the default,
``"on-demand"``, is that class itself. :class:`UpFrontReservation` is the other rule: a running request
is never preempted, at the price of blocks promised (and idle) from admission to the end. Units: blocks
of ``block_size`` token slots; tokens for lengths.
"""

from __future__ import annotations

from servelab.engine.config import RESERVATION_POLICIES
from servelab.engine.scheduler import ReservationPolicy
from servelab.kv.arithmetic import blocks_for

__all__ = ["UpFrontReservation", "RESERVATIONS", "reservation_policy"]


class UpFrontReservation(ReservationPolicy):
    """``"up-front"`` (as TGI): admission also reserves the blocks of ``max_tokens`` more tokens per sample
    (capped at ``max_model_len``), plus a copy-on-write block each when ``n > 1`` samples share a partly
    filled prompt tail, so a running request never meets an empty pool."""

    name = "up-front"
    preempts = False

    def output_blocks(self, num_tokens: int, remaining_tokens: int, samples: int) -> int:
        """Blocks promised for ``remaining_tokens`` more tokens per sample beyond the ``num_tokens`` there."""
        final = self._capped(num_tokens + remaining_tokens)
        cow = 1 if samples > 1 and num_tokens % self.block_size else 0
        return samples * (blocks_for(final, self.block_size) - blocks_for(num_tokens, self.block_size) + cow)

    def worst_case_blocks(self, prompt_tokens: int, max_tokens: int, samples: int) -> int:
        """The prompt's blocks plus the whole output promise, held at once from admission."""
        return blocks_for(prompt_tokens, self.block_size) + self.output_blocks(prompt_tokens, max_tokens, samples)


RESERVATIONS: dict[str, type[ReservationPolicy]] = {"on-demand": ReservationPolicy, "up-front": UpFrontReservation}
assert tuple(RESERVATIONS) == RESERVATION_POLICIES


def reservation_policy(name: str, block_size: int, max_model_len: int | None = None) -> ReservationPolicy:
    """The rule called ``name`` (one of :data:`~servelab.engine.config.RESERVATION_POLICIES`) for a pool of
    ``block_size``-token blocks and a context limit of ``max_model_len`` tokens (None: no cap)."""
    if name not in RESERVATIONS:
        raise ValueError(f"reservation_policy must be one of {RESERVATION_POLICIES}, got {name!r}")
    return RESERVATIONS[name](block_size, max_model_len)
