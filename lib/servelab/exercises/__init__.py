"""Checkers for the exercise notebooks: students implement a mechanism, a checker runs hidden cases.

Each ``check_*`` function takes the student's function or class, compares it case by case with the
reference implementation in ``servelab``, prints which case failed and why, and returns a
:class:`CheckResult` (``.passed``, ``.failures``, ``.not_implemented``). A checker never raises: the
stub shipped in a notebook raises ``NotImplementedError``, which is reported as "not implemented yet".

======================  =====================================  ===========================================
checker                 student writes                         reference
======================  =====================================  ===========================================
``check_top_p``         ``top_p(probs, p)``                    ``servelab.sampling.top_p_filter``
``check_min_p``         ``min_p(probs, alpha)``                ``servelab.sampling.min_p_filter``
``check_stop_buffer``   class ``StopBuffer(stop_strings)``     ``servelab.streaming.StopStringBuffer``
``check_block_allocator`` class ``Allocator(num_blocks, bs)``  ``servelab.kv.BlockAllocator``
``check_batching_tick`` ``tick(running, queue, capacity)``     ``servelab.batching.simulate_batching``
``check_goodput``       ``goodput(records, ttft, tpot, win)``  ``servelab.metrics.goodput``
======================  =====================================  ===========================================
"""

from servelab.exercises.kv import ReferenceAllocator, check_block_allocator
from servelab.exercises.metrics import check_goodput
from servelab.exercises.result import CaseResult, CheckResult
from servelab.exercises.sampling import check_min_p, check_top_p
from servelab.exercises.scheduling import check_batching_tick, reference_tick
from servelab.exercises.streaming import check_stop_buffer

__all__ = [
    "CaseResult",
    "CheckResult",
    "ReferenceAllocator",
    "check_batching_tick",
    "check_block_allocator",
    "check_goodput",
    "check_min_p",
    "check_stop_buffer",
    "check_top_p",
    "reference_tick",
]
