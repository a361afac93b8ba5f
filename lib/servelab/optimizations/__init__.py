"""§7, making one replica faster or cheaper, each measured against the plain engine.

* :mod:`servelab.optimizations.speculative`: the exact accept/correct rule of speculative
  sampling and a KV-cached draft-then-verify decoder (a draft model, or prompt lookup);
* :mod:`servelab.optimizations.quantization`: weight-only int8 projections, and KV-cache
  quantization as a capacity trade-off;
* :mod:`servelab.optimizations.step_cost`: one decode step's time against batch size, and the knee
  where it stops being flat.
"""
