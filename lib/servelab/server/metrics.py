"""Prometheus metrics of the course server, named after vLLM's (``vllm:`` becomes ``servelab:``).

Served at ``GET /metrics`` in Prometheus' text format (``prometheus_client``, the library vLLM and
SGLang use). Each app has its own :class:`~prometheus_client.CollectorRegistry`, so several servers
can run in one process (tests, notebooks). Every series carries ``model_name``; token counters also
``tenant``.

| metric | kind | meaning |
| --- | --- | --- |
| ``servelab:num_requests_running`` | gauge | sequences holding a batch slot and KV (read at scrape) |
| ``servelab:num_requests_waiting`` | gauge | sequences waiting for admission |
| ``servelab:num_requests_swapped`` | gauge | sequences swapped out to host memory |
| ``servelab:kv_cache_usage_perc`` | gauge | fraction of KV blocks in use, 0..1 (vLLM's name) |
| ``servelab:num_preemptions_total`` | counter | sequences preempted (recompute or swap) |
| ``servelab:prompt_tokens_total`` | counter | prompt tokens of requests the engine accepted |
| ``servelab:generation_tokens_total`` | counter | tokens the engine generated |
| ``servelab:prefix_cache_queries_total`` | counter | prompt tokens looked up in the prefix cache (tokens) |
| ``servelab:prefix_cache_hits_total`` | counter | of those, tokens whose KV the cache supplied (tokens) |
| ``servelab:iteration_tokens_total`` | histogram | tokens in one engine step's forward pass (prefill + decode) |
| ``servelab:grammar_compile_seconds`` | histogram | compiling a request's structured-output grammar (before submit, so never in TTFT) |
| ``servelab:request_success_total`` | counter | ended requests, by ``finished_reason`` (see below) |
| ``servelab:request_queue_time_seconds`` | histogram | submit to the bridge -> admitted by the scheduler |
| ``servelab:time_to_first_token_seconds`` | histogram | submit -> the engine thread hands out the first token |
| ``servelab:inter_token_latency_seconds`` | histogram | between two consecutive outputs of a request |
| ``servelab:e2e_request_latency_seconds`` | histogram | submit -> the request ended |

Prefix-cache tokens are counted when a request's first output arrives (its admission has settled how
much of the prompt the cache supplied); a request cancelled before that is not counted. The hit rate
is ``hits / queries``, as in vLLM.

``finished_reason`` is ``stop`` (a stop string or EOS), ``length``, ``abort`` (cancelled: the client
went away, or the bridge gave up on it), ``timeout`` (its deadline passed) or ``error`` (the engine
failed it).

System boundary: the server's, not the client's. "Submit" is when the handler, after parsing and
tokenizing, queues the request to the engine thread; "hands out" is when that thread puts an output
into the request's stream. Network transit, HTTP parsing, tokenization, the SSE write and the
client's own parsing are outside, so a client measures a longer TTFT than these histograms. Times
are ``time.monotonic`` seconds.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from servelab.engine.llm_engine import EngineStats

__all__ = [
    "ServerMetrics",
    "CONTENT_TYPE_LATEST",
    "LATENCY_BUCKETS_S",
    "ITERATION_TOKEN_BUCKETS",
    "FINISHED_REASONS",
]

# vLLM's TTFT buckets (seconds), which also cover a CPU engine's inter-token gaps and end-to-end
# times
LATENCY_BUCKETS_S = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
)
# tokens per step, as vLLM
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
FINISHED_REASONS = {
    "stop": "stop",
    "eos": "stop",
    "length": "length",
    "cancelled": "abort",
    "timed_out": "timeout",
    "failed": "error",
}


class ServerMetrics:
    """The server's metric families in a private registry; observed from the bridge's engine thread
    (``prometheus_client`` is thread-safe) and rendered by the ``/metrics`` handler."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry()
        model = ["model_name"]
        self._gauges = {
            name: Gauge(f"servelab:{name}", doc, model, registry=self.registry)
            for name, doc in (
                ("num_requests_running", "Sequences holding a batch slot and KV blocks."),
                ("num_requests_waiting", "Sequences waiting for admission."),
                ("num_requests_swapped", "Sequences swapped out to host memory."),
                ("kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0..1)."),
            )
        }
        self.preemptions = Counter(
            "servelab:num_preemptions",
            "Sequences preempted (recompute or swap).",
            model,
            registry=self.registry,
        ).labels(model_name)
        tokens = ["model_name", "tenant"]
        self.prompt_tokens = Counter(
            "servelab:prompt_tokens",
            "Prompt tokens of accepted requests.",
            tokens,
            registry=self.registry,
        )
        self.generation_tokens = Counter(
            "servelab:generation_tokens",
            "Tokens generated by the engine.",
            tokens,
            registry=self.registry,
        )
        self.prefix_cache_queries = Counter(
            "servelab:prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache.",
            model,
            registry=self.registry,
        ).labels(model_name)
        self.prefix_cache_hits = Counter(
            "servelab:prefix_cache_hits",
            "Prompt tokens the prefix cache supplied.",
            model,
            registry=self.registry,
        ).labels(model_name)
        self.iteration_tokens = Histogram(
            "servelab:iteration_tokens_total",
            "Tokens in one engine step.",
            model,
            buckets=ITERATION_TOKEN_BUCKETS,
            registry=self.registry,
        ).labels(model_name)
        self.request_success = Counter(
            "servelab:request_success",
            "Ended requests by finished_reason.",
            ["model_name", "finished_reason"],
            registry=self.registry,
        )
        self.queue_time = self._histogram(
            "request_queue_time_seconds", "Submit to the engine -> admitted."
        )
        self.ttft = self._histogram(
            "time_to_first_token_seconds", "Submit to the engine -> first generated token."
        )
        self.itl = self._histogram(
            "inter_token_latency_seconds", "Time between two outputs of one request."
        )
        self.e2e = self._histogram(
            "e2e_request_latency_seconds", "Submit to the engine -> request ended."
        )
        self.grammar_compile = self._histogram(
            "grammar_compile_seconds", "Compiling a structured-output grammar."
        )
        self._spec = {
            name: Counter(f"servelab:spec_decode_{name}", doc, model, registry=self.registry)
            for name, doc in (
                ("num_drafts", "Verify rows with proposals (speculative decoding)."),
                ("num_draft_tokens", "Proposed tokens verified."),
                ("num_accepted_tokens", "Proposed tokens accepted."),
            )
        }
        self._spec_per_pos = Counter(
            "servelab:spec_decode_num_accepted_tokens_per_pos",
            "Proposals accepted at each position of a verify row.",
            ["model_name", "position"],
            registry=self.registry,
        )
        # engine totals already counted (the counters grow by the difference)
        self._spec_seen: dict[str, int] = {}

    def _histogram(self, name: str, doc: str):
        return Histogram(f"servelab:{name}", doc, ["model_name"], buckets=LATENCY_BUCKETS_S,
                         registry=self.registry).labels(self.model_name)

    def set_engine_stats(self, stats: EngineStats) -> None:
        """Copy the engine's load into the gauges (done at each scrape)."""
        for name, value in (
            ("num_requests_running", stats.num_running),
            ("num_requests_waiting", stats.num_waiting),
            ("num_requests_swapped", stats.num_swapped),
            ("kv_cache_usage_perc", stats.kv_cache_usage),
        ):
            self._gauges[name].labels(self.model_name).set(value)
        if stats.spec_decoding is not None:
            self._count_spec(stats.spec_decoding)

    def _count_spec(self, spec) -> None:
        """Advance the speculative-decoding counters to the engine's totals (vLLM's
        ``spec_decode_*``)."""
        counters = [
            (self._spec[name].labels(self.model_name), name, getattr(spec, name))
            for name in self._spec
        ]
        counters += [(self._spec_per_pos.labels(self.model_name, str(i)), f"position {i}", total)
                     for i, total in enumerate(spec.num_accepted_tokens_per_pos)]
        for counter, key, total in counters:
            counter.inc(total - self._spec_seen.get(key, 0))
            self._spec_seen[key] = total

    def tokens(self, tenant: str, prompt: int = 0, generated: int = 0) -> None:
        """Count ``prompt`` accepted prompt tokens and ``generated`` new tokens for ``tenant``."""
        if prompt:
            self.prompt_tokens.labels(self.model_name, tenant).inc(prompt)
        if generated:
            self.generation_tokens.labels(self.model_name, tenant).inc(generated)

    def finished(self, engine_reason: str | None, e2e_s: float) -> None:
        """A request ended with the engine's ``finish_reason`` (None: the bridge ended it) after
        ``e2e_s``."""
        reason = FINISHED_REASONS.get(engine_reason, "abort")
        self.request_success.labels(self.model_name, reason).inc()
        self.e2e.observe(e2e_s)

    def render(self) -> bytes:
        """The registry in Prometheus' text exposition format."""
        return generate_latest(self.registry)
