"""Cold start measured in a fresh interpreter: the phases, in order, from a process without torch."""

import pytest

from servelab.server.coldstart import PHASES, measure_cold_start


@pytest.fixture(scope="module")
def cold():
    return measure_cold_start(n_steady=3)


def test_phases_come_in_order_from_a_fresh_interpreter(cold):
    assert not cold.torch_preloaded
    assert tuple(p.name for p in cold.phases) == PHASES
    assert len(cold.steady_ttft) == 3
    for p in cold.phases + cold.steady_ttft + (cold.warm_forward, cold.file_read):
        assert p.wall_s > 0 and p.cpu_s >= 0 and p.new_modules >= 0


def test_imports_happen_in_the_import_phase_and_none_while_serving(cold):
    assert cold.phase("import").new_modules > 100  # torch and the engine
    assert all(p.new_modules == 0 for p in cold.steady_ttft)
    assert cold.phase("first request").new_modules == 0


def test_starting_costs_more_than_a_request(cold):
    start = sum(cold.phase(n).cpu_s for n in ("import", "weight load"))
    assert start > 10 * max(p.cpu_s for p in cold.steady_ttft)


def test_arguments_are_checked(cold):
    with pytest.raises(ValueError, match="n_steady"):
        measure_cold_start(n_steady=0)
    with pytest.raises(ValueError, match="name"):
        cold.phase("boot")
