"""§5, scheduling: who runs in the next step, in which order, and whether it fits.

* :mod:`servelab.scheduling.batching`: tick simulations of one scheduler (static vs continuous
  batching, queue-policy fairness and its remedies, chunked vs unchunked prefill);
* :mod:`servelab.scheduling.queue_policy`: queue order, one interface for the engine's scheduler and
  the simulators (FCFS and :func:`~servelab.scheduling.queue_policy.rank_waiting`);
* :mod:`servelab.scheduling.queue_disciplines`: priority classes, shortest job first, SJF with
  aging, per-tenant fair queuing.

The engine's own scheduler, which runs these orders every step, is :mod:`servelab.engine.scheduler`.
"""
