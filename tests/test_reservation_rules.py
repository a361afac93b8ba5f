"""The reservation rule's words match the engine's behaviour, and the state table reads them."""

from __future__ import annotations

import pytest

from servelab.engine import EngineConfig
from servelab.engine.config import RESERVATION_POLICIES
from servelab.engine.admission import reservation_policy
from servelab.lifecycle.state_machine import STATE_TABLE, RequestState
from servelab.lifecycle.reservation_rules import RULES, default_policy, default_rule, rule_for
from servelab.viz.lifecycle import state_guard, state_table


def test_every_policy_has_one_rule_and_the_default_comes_from_the_config():
    assert set(RULES) == set(RESERVATION_POLICIES)
    assert default_policy() == EngineConfig().reservation_policy
    assert default_rule() == rule_for(EngineConfig().reservation_policy)
    with pytest.raises(ValueError):
        rule_for("optimistic")


@pytest.mark.parametrize("policy", RESERVATION_POLICIES)
def test_the_words_say_what_the_policy_reserves(policy):
    # output blocks promised at admission for a 20-token prompt asking for 40 more tokens
    promised = reservation_policy(policy, block_size=16).output_blocks(20, 40, samples=1)
    words = rule_for(policy)
    assert "uncached prompt" in words
    if promised:
        assert "max_tokens" in words and "only" not in words
    else:
        assert "only" in words and "max_tokens" not in words


def test_the_queued_guard_states_the_default_rule_and_nothing_else():
    guard = state_guard(RequestState.QUEUED)
    assert default_rule() in guard and default_policy() in guard
    assert "predicted output" not in guard
    table = state_table()
    assert any(default_rule() in str(row) for row in table.rows)
    assert "reservation" not in state_guard(RequestState.DECODE)  # only the admission states get it
    assert state_guard(RequestState.DECODE) == STATE_TABLE[RequestState.DECODE].guard
