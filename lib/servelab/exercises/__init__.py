"""Checkers for the exercise notebooks: students implement a mechanism, a checker runs hidden cases.

Each ``check_*`` function takes the student's functions or class, compares it case by case with a
reference built on the library, prints one line per case (the rule it tests, the points, and for a
failure what went in, what came out, what was expected and the steps that led there), and returns a
:class:`CheckResult` (``.passed``, ``.failures``, ``.points``, ``.max_points``,
``.not_implemented``). A checker never raises: the stub shipped in a notebook raises
``NotImplementedError``, which is reported as "not implemented yet". ``seed=None`` runs the public
cases; ``seed=N`` the hidden cases the grader draws from an instructor's secret seed
(:mod:`servelab.exercises.hidden`). The public cases' expected values are committed data; the
reference solutions that compute them, and the hidden cases' expected values, live in the
instructor-only package ``servelab_instructor``, which this package's wheel does not contain
(:mod:`servelab.exercises.expected`). The batch grader that calls every student's code in an
isolated worker on the hidden cases is instructor-only too: ``SERVELAB_GRADE_SEED=N python -m
servelab_instructor.grader grade SUBMISSIONS_DIR``.

========================  ================================================  ==================================
checker                   student writes                                    reference built on
========================  ================================================  ==================================
``check_top_p``           ``top_p(probs, p)``                               ``servelab.sampling.top_p_filter``
``check_min_p``           ``min_p(probs, alpha)``                           ``servelab.sampling.min_p_filter``
``check_stop_buffer``     class ``StopBuffer(stop_strings)``                ``servelab.sampling.stop_strings.StopStringBuffer``
``check_block_allocator`` class ``Allocator(num_blocks, block_size)``       ``servelab.kv.BlockAllocator``
``check_batching_tick``   ``tick(running, queue, capacity)``                ``servelab.scheduling.batching.simulate_batching``
``check_goodput``         ``goodput(records, ttft, tpot, window)``          ``servelab.metrics.latency.goodput``
``check_speculative``     ``accept_probability(p, q, token)``, ``residual``  ``servelab.optimizations.speculative``
``check_kv_sizing``       ``kv_bytes_per_token(...)``, ``max_requests(...)``  ``servelab.kv``
``check_admission``       ``admit(queue, pool_blocks, held, bs, slots)``    ``servelab.kv.BlockAllocator.reserve``
``check_paged_attention`` ``paged_attention(q, k_cache, v_cache, table,``   ``torch`` SDPA on contiguous K, V
                          ``positions)``
``check_scheduler_tick``  ``schedule(running, waiting, free_blocks, bs,``   the rule's invariants, every tick
                          ``token_budget, max_num_seqs)``
========================  ================================================  ==================================
"""

from servelab.exercises.admission import check_admission
from servelab.exercises.attention import check_paged_attention
from servelab.exercises.catalog import worked_example
from servelab.exercises.kv import check_block_allocator
from servelab.exercises.metrics import check_goodput
from servelab.exercises.result import CaseResult, CheckResult
from servelab.exercises.sampling import check_min_p, check_top_p
from servelab.exercises.scheduling import check_batching_tick
from servelab.exercises.sizing import check_kv_sizing
from servelab.exercises.speculative import check_speculative
from servelab.exercises.streaming import check_stop_buffer
from servelab.exercises.tick import check_scheduler_tick

__all__ = [
    "CaseResult",
    "CheckResult",
    "check_admission",
    "check_batching_tick",
    "check_block_allocator",
    "check_goodput",
    "check_kv_sizing",
    "check_min_p",
    "check_paged_attention",
    "check_scheduler_tick",
    "check_speculative",
    "check_stop_buffer",
    "check_top_p",
    "worked_example",
]
