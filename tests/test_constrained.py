import math

import numpy as np
import pytest

from servelab import sampling as smp
from servelab.sampling.constrained import ChoiceAutomaton, allowed_token_ids, constrained_logits

# a toy vocabulary with several spellings of each choice; id 7 is an undecodable byte piece
VOCAB = ["A", "B", "AB", "ABC", "C", ":", ":\n", "\ufffd", "\n", "BA", "X", "ABC:\n"]
CHOICES = ["ABC:\n", "BA:\n"]


@pytest.fixture
def automaton() -> ChoiceAutomaton:
    return ChoiceAutomaton(CHOICES, VOCAB)


def _is_prefix_of_some_choice(text: str) -> bool:
    return any(c.startswith(text) for c in CHOICES)


@pytest.mark.parametrize("state", ["", "A", "AB", "ABC", "ABC:", "B", "BA", "BA:"])
def test_prefix_legal_is_exactly_the_text_prefix_rule(automaton, state):
    expected = [t for t, text in enumerate(VOCAB)
                if text and "\ufffd" not in text and _is_prefix_of_some_choice(state + text)]
    assert automaton.prefix_legal(state) == expected
    assert allowed_token_ids(automaton, state) == expected


def test_spell_costs_are_shortest_paths(automaton):
    assert automaton.spell_cost["ABC:\n"] == [1, 3, 2, 1, 1, 0]
    assert automaton.spell_cost["BA:\n"][0] == 2
    assert automaton.tokens_to_finish("") == 1
    assert automaton.tokens_to_finish("X") == math.inf


def test_lookahead_never_admits_a_dead_end_but_prefix_only_can():
    vocab = ["A", "B", "C", "AB", ":\n"]
    auto = ChoiceAutomaton(["ABC:\n"], vocab)
    tight = int(auto.spell_cost["ABC:\n"][0])  # "AB", "C", ":\n"
    assert tight == 3
    naive = auto.prefix_legal("")
    safe = auto.legal("", tight)
    assert vocab.index("A") in naive and vocab.index("A") not in safe  # "A" then 2 tokens: too few
    for state in ("", "AB", "ABC"):
        for budget in range(1, 5):
            for t in auto.legal(state, budget):
                assert auto.tokens_to_finish(state + vocab[t]) <= budget - 1


@pytest.mark.parametrize("seed", range(20))
def test_random_logits_always_end_in_an_allowed_string(automaton, seed):
    rng = np.random.default_rng(seed)
    budget = max(int(automaton.spell_cost[c][0]) for c in CHOICES) + 1
    state = ""
    for step in range(budget):
        logits = rng.normal(size=len(VOCAB)) * 3
        masked = constrained_logits(logits, automaton, state, budget - step)
        state += VOCAB[smp.sample(smp.softmax(masked), rng)]
        if automaton.accepts(state):
            break
    assert state in CHOICES


def test_mask_sets_illegal_logits_to_minus_inf(automaton):
    masked = constrained_logits(np.zeros(len(VOCAB)), automaton, "AB", 2)
    legal = set(automaton.legal("AB", 2))
    assert all((masked[t] == 0) == (t in legal) for t in range(len(VOCAB)))
    assert np.isneginf(masked[[t for t in range(len(VOCAB)) if t not in legal]]).all()


def test_dead_end_raises(automaton):
    assert allowed_token_ids(automaton, "X") == []
    with pytest.raises(ValueError, match="dead end"):
        constrained_logits(np.zeros(len(VOCAB)), automaton, "X")


def test_bad_inputs(automaton):
    with pytest.raises(TypeError, match="choices"):
        ChoiceAutomaton("ABC", VOCAB)
    with pytest.raises(ValueError, match="choices"):
        ChoiceAutomaton([], VOCAB)
    with pytest.raises(ValueError, match="choices"):
        ChoiceAutomaton([""], VOCAB)
    with pytest.raises(TypeError, match="vocab"):
        ChoiceAutomaton(CHOICES, [1, 2])
    with pytest.raises(TypeError, match="state"):
        automaton.prefix_legal(None)
    with pytest.raises(ValueError, match="budget"):
        automaton.legal("", 0)
    with pytest.raises(TypeError, match="budget"):
        allowed_token_ids(automaton, "", 1.5)
    with pytest.raises(TypeError, match="automaton"):
        allowed_token_ids("not an automaton", "")
