"""From one engine to a cluster: parallelism arithmetic and prefill/decode disaggregation.

* :mod:`servelab.cluster.assumptions`: the device model (:class:`Accelerator`) and the inputs the
  chapter states once (:class:`ClusterAssumptions`);
* :mod:`servelab.cluster.parallelism`: tensor, pipeline and expert parallelism;
* :mod:`servelab.cluster.disaggregation`: shipping a prompt's KV against co-located prefill, chunked
  or not.

Multi-LoRA adapter serving is a single-replica concern and lives in
:mod:`servelab.cluster.adapters`.
"""

from servelab.cluster.assumptions import Accelerator, ClusterAssumptions
from servelab.cluster.disaggregation import (
    PLACEMENTS,
    DisaggregationEstimate,
    PrefillPlacement,
    colocated_stall_s,
    compare_prefill_placements,
    disaggregation_break_even_bandwidth,
    disaggregation_estimate,
    prefill_chunk_cost,
)
from servelab.cluster.parallelism import (
    EPTraffic,
    TPStep,
    ep_all_to_all_bytes,
    expert_rank_loads,
    pipeline_schedule,
    pp_bubble_fraction,
    ring_allreduce_bytes,
    tp_allreduce_message_bytes,
    tp_decode_step,
)

__all__ = [
    "Accelerator",
    "ClusterAssumptions",
    "DisaggregationEstimate",
    "EPTraffic",
    "PLACEMENTS",
    "PrefillPlacement",
    "TPStep",
    "colocated_stall_s",
    "compare_prefill_placements",
    "disaggregation_break_even_bandwidth",
    "disaggregation_estimate",
    "ep_all_to_all_bytes",
    "expert_rank_loads",
    "pipeline_schedule",
    "pp_bubble_fraction",
    "prefill_chunk_cost",
    "ring_allreduce_bytes",
    "tp_allreduce_message_bytes",
    "tp_decode_step",
]
