"""Measurements of the engine, kept apart from the engine itself (nothing here runs in
``LLMEngine.step``).

* :mod:`~servelab.bench.engine_bench` -- the engine benchmark, ``python -m servelab.bench``: the
  engine vs the no-KV-cache loop vs ``transformers`` ``generate``, batching, prefix cache, chunked
  prefill, step cost;
* :mod:`~servelab.bench.decode_floor` -- the decode step against this machine's roofline floor
  (``python -m servelab.bench --model smollm2-135m``);
* :mod:`~servelab.bench.gpu_results` -- the prepared GPU check's JSON read back (the check itself:
  ``bash tools/gpu_check.sh``), and the §5 table made from it;
* :mod:`~servelab.bench.timing` -- the timing discipline every speed claim uses: A vs B interleaved,
  paired ratios, a bootstrap band, and "faster"/"slower" only when the band leaves 1;
* :mod:`~servelab.bench.machine` -- this machine's profile (CPU, flags, bandwidth, matmul peaks, one
  operator's cost, load), measured once per build and read by every page that describes "this
  machine";
* :mod:`~servelab.bench.claims` -- the built book's measured claims checked against each other: one
  value per profile quantity, no speed word inside its band, no fitted fixed part above a measured
  total;
* :mod:`~servelab.bench.admission_study` -- the admission rules (reservation policies) compared.
"""
