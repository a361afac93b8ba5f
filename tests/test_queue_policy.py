"""The shared queue policies: keys over ``Queued``, SJF with aging, per-tenant fair queuing."""

from dataclasses import dataclass

from servelab.scheduling.queue_disciplines import aging, fair_queuing, priority, shortest_job_first
from servelab.scheduling.queue_policy import POLICIES, fcfs


@dataclass(frozen=True)
class Waiting:
    name: str
    arrival_index: int
    priority: int = 0
    remaining_tokens: int = 1
    tenant: str = "default"
    waited: int = 0


def names(reqs) -> list[str]:
    return [r.name for r in reqs]


QUEUE = [Waiting("a", 0, priority=2, remaining_tokens=9), Waiting("b", 1, priority=1, remaining_tokens=3),
         Waiting("c", 2, priority=1, remaining_tokens=3), Waiting("d", 3, priority=0, remaining_tokens=5)]


def test_the_engine_names_the_three_keys():
    assert POLICIES == {"fcfs": fcfs, "priority": priority, "sjf": shortest_job_first}


def test_keys_order_by_their_field_then_arrival():
    assert names(sorted(QUEUE, key=fcfs)) == ["a", "b", "c", "d"]
    assert names(sorted(QUEUE, key=priority)) == ["d", "b", "c", "a"]
    assert names(sorted(QUEUE, key=shortest_job_first)) == ["b", "c", "d", "a"]


def test_aging_lifts_a_long_wait_and_rate_zero_is_sjf():
    queue = [Waiting("long", 0, remaining_tokens=8, waited=6), Waiting("short", 1, remaining_tokens=2)]
    assert names(sorted(queue, key=aging(0.0))) == names(sorted(queue, key=shortest_job_first)) == ["short", "long"]
    assert names(sorted(queue, key=aging(1.0))) == ["long", "short"]  # 8 - 6 = 2 ties, arrival breaks it


def test_fair_queuing_alternates_tenants_and_charges_each_pick():
    queue = [Waiting("x0", 0, tenant="x"), Waiting("x1", 1, tenant="x"), Waiting("y0", 2, tenant="y")]
    assert names(fair_queuing(queue, {})) == ["x0", "y0", "x1"]
    assert names(fair_queuing(queue, {"x": 5})) == ["y0", "x0", "x1"]


def test_single_tenant_fair_queuing_is_fcfs():
    queue = [Waiting("q", 2), Waiting("p", 0), Waiting("r", 1)]
    assert fair_queuing(queue, {"default": 3}) == sorted(queue, key=fcfs)
