"""The KV admission rule in words: one sentence per reservation policy, the one place the book takes
it from.

``EngineConfig.reservation_policy`` names the rule an engine admits by (the behaviour lives in
``servelab.engine.admission``). The state table's guard, its hover text in the state diagram and
every sentence of the book that says what a reservation covers are built from :func:`rule_for` and
:func:`default_policy`, so the book cannot state the rule two ways.
``tests/test_reservation_rules.py`` checks each sentence against the policy's behaviour;
``browser_tests/test_html.py`` checks that every page states it in these words.
"""

from __future__ import annotations

__all__ = ["RULES", "default_policy", "default_rule", "rule_for"]

RULES: dict[str, str] = {
    "on-demand": "the blocks of the uncached prompt only, the output growing block by block",
    "up-front": "the blocks of the uncached prompt plus those of max_tokens more tokens",
    "per-step": ("nothing ahead: each step allocates blocks only for the uncached prompt tokens it "
                 "schedules (a chunk at a time), then one decode token at a time"),
}
"""What admission reserves under each policy of ``servelab.engine.config.RESERVATION_POLICIES``."""


def rule_for(policy: str) -> str:
    """What a request's KV reservation covers under ``policy`` (a reservation-policy name)."""
    if policy not in RULES:
        raise ValueError(f"policy must be one of {tuple(RULES)}, got {policy!r}")
    return RULES[policy]


def default_policy() -> str:
    """The policy a default ``EngineConfig`` admits by, read from the config itself."""
    # late: servelab.engine imports servelab.lifecycle.state_machine
    from servelab.engine import EngineConfig

    return EngineConfig().reservation_policy


def default_rule() -> str:
    """:func:`rule_for` the default policy."""
    return rule_for(default_policy())
