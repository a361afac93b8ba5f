"""The server's own knobs, :class:`ServerConfig`, and the model name it serves by default.

The engine's knobs live in :class:`servelab.engine.EngineConfig`; both the HTTP application
(:mod:`~servelab.server.app`) and request parsing (:mod:`~servelab.server.protocol`) read this one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from servelab.server.gate import TenantLimits

__all__ = ["DEFAULT_MODEL_NAME", "ServerConfig"]

DEFAULT_MODEL_NAME = "servelab-shakespeare"


@dataclass(frozen=True)
class ServerConfig:
    """Server knobs (the engine's own knobs live in :class:`servelab.engine.EngineConfig`).

    ``api_keys`` maps key -> tenant (None: open server, one anonymous tenant); ``tenant_limits`` /
    ``per_tenant_limits`` set rate and quota; ``max_body_bytes`` caps a request body;
    ``max_waiting`` bounds the queue of unscheduled requests and ``queue_timeout_s`` how long one
    may wait there; ``request_timeout_s`` is the default and the largest ``deadline_s``;
    ``stream_buffer_chunks`` bounds undelivered chunks per request: a full buffer pauses the request
    (backpressure) until the reader drains it, and ``backpressure_timeout_s`` later it is cancelled;
    ``max_n`` caps ``n``; ``default_max_tokens`` applies to a completions request that sets none (a
    chat request without one may use the rest of the context, as vLLM's).
    """

    model_name: str = DEFAULT_MODEL_NAME
    api_keys: Mapping[str, str] | None = None
    tenant_limits: TenantLimits = TenantLimits()
    per_tenant_limits: Mapping[str, TenantLimits] = field(default_factory=dict)
    max_body_bytes: int = 64 * 1024
    max_waiting: int = 64
    queue_timeout_s: float = 10.0
    request_timeout_s: float = 120.0
    stream_buffer_chunks: int = 64
    backpressure_timeout_s: float = 30.0
    max_n: int = 8
    default_max_tokens: int = 16

    def __post_init__(self) -> None:
        if not isinstance(self.model_name, str) or not self.model_name:
            raise ValueError("model_name must be a non-empty string")
        for name in ("max_n", "default_max_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if (
            isinstance(self.request_timeout_s, bool)
            or not isinstance(self.request_timeout_s, (int, float))
            or not 0 < self.request_timeout_s < math.inf
        ):
            raise ValueError(
                f"request_timeout_s must be a finite number > 0, got {self.request_timeout_s!r}"
            )
