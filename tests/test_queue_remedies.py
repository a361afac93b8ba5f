"""Starvation remedies of ``simulate_queue_policies``: SJF with aging, priority classes, fair queuing."""

import pytest

from servelab.scheduling.batching import Request, simulate_queue_policies


def stream(until: int, long_priority: int = 0, short_priority: int = 0) -> list[Request]:
    """§1's workload: a long job (8 tokens, tenant docs) and two short ones (2 tokens, tenant chat)
    at tick 0, then a pair of short chat jobs every 2 ticks up to ``until``."""
    head = [Request("a", 0, 2, "chat", short_priority), Request("b", 0, 2, "chat", short_priority),
            Request("long", 0, 8, "docs", long_priority)]
    return head + [Request(f"s{t}{k}", t, 2, "chat", short_priority)
                   for t in range(2, until + 1, 2) for k in "xy"]


def waits(workload: list[Request], policy: str, **kw) -> tuple[int, int]:
    """(the long job's wait, the worst short wait) in ticks on two slots."""
    out, _ = simulate_queue_policies(workload, policy, capacity=2, **kw)
    return out["long"].wait, max(o.wait for n, o in out.items() if n != "long")


def test_sjf_starves_the_long_output_for_as_long_as_short_jobs_arrive():
    assert waits(stream(6), "sjf")[0] == 8
    assert waits(stream(30), "sjf")[0] == 32


@pytest.mark.parametrize("until", [6, 30])
def test_aging_bounds_the_long_wait_whatever_the_stream_length(until):
    assert waits(stream(until), "sjf-aging", aging_rate=1.0)[0] == 6 < waits(stream(until), "sjf")[0]


def test_aging_keeps_short_jobs_ahead_of_fcfs():
    assert waits(stream(6), "sjf-aging", aging_rate=1.0)[1] < waits(stream(6), "fcfs")[1]


def test_faster_aging_moves_toward_fcfs():
    by_rate = [waits(stream(6), "sjf-aging", aging_rate=r)[0] for r in (0.0, 1.0, 2.0, 3.0)]
    assert by_rate == sorted(by_rate, reverse=True)
    assert by_rate[0] == waits(stream(6), "sjf")[0]  # no aging is plain SJF
    assert by_rate[-1] == waits(stream(6), "fcfs")[0]


def test_fair_queuing_gives_the_long_jobs_tenant_a_slot_at_once():
    for until in (6, 30):
        assert waits(stream(until), "fair-queuing")[0] == 0 < waits(stream(until), "fcfs")[0]


def test_fair_queuing_shares_slots_by_tokens_served():
    # two tenants, two slots, equal jobs: each tenant holds one slot at a time
    work = [Request(f"{t}{i}", 0, 2, t) for t in "xy" for i in range(3)]
    _, trace = simulate_queue_policies(work, "fair-queuing", capacity=2)
    for rec in trace:
        assert sorted(n[0] for n in rec.active) == ["x", "y"]


def test_priority_classes_protect_only_the_class_on_top():
    assert waits(stream(6, long_priority=0, short_priority=1), "priority")[0] == 0
    assert waits(stream(30, long_priority=1, short_priority=0), "priority")[0] == 32


def test_single_tenant_fair_queuing_is_fcfs():
    work = [Request("p", 0, 3), Request("q", 1, 1), Request("r", 1, 2)]
    fair, _ = simulate_queue_policies(work, "fair-queuing", capacity=1)
    fcfs, _ = simulate_queue_policies(work, "fcfs", capacity=1)
    assert fair == fcfs


def test_remedy_arguments_are_checked():
    with pytest.raises(ValueError, match="aging_rate"):
        simulate_queue_policies(stream(2), "sjf-aging", aging_rate=-1.0)
    with pytest.raises(ValueError, match="tenant"):
        Request("x", 0, 1, tenant="")
    with pytest.raises(TypeError, match="priority"):
        Request("x", 0, 1, priority=0.5)
