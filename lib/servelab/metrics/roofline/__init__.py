"""The roofline: which ceiling, memory bandwidth or compute, bounds a forward pass.

* :mod:`servelab.metrics.roofline.analytic`: the roofline on paper for an idealised dense decoder
  (ridge point, attainable FLOP/s, the FLOPs and bytes of prefill and decode); plain Python,
  exported here;
* :mod:`servelab.metrics.roofline.measured`: this machine's roofline, measured with torch (read
  bandwidth, peak matmul FLOP/s, per-operator overhead) and the floor of a real decode step.

The measured half is imported from its module (``from servelab.metrics.roofline.measured import
measure_roofline``) so that the calculators built on the analytic half do not import torch.
"""

from servelab.metrics.roofline.analytic import (
    ModelShape,
    PhaseCost,
    attainable_flops,
    causal_attention_flops,
    decode_cost,
    prefill_cost,
    ridge_point,
)

__all__ = [
    "ModelShape",
    "PhaseCost",
    "attainable_flops",
    "causal_attention_flops",
    "decode_cost",
    "prefill_cost",
    "ridge_point",
]
