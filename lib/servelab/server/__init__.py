"""An OpenAI-compatible streaming server on the course engine.

Layers, outermost first: the ingress gate (:mod:`~servelab.server.gate`: body size, tenant, rate,
quota -- before tokenization), the HTTP application (:mod:`~servelab.server.app`: routes, handlers,
error middleware; its knobs in :mod:`~servelab.server.config`) with the request side of the protocol
(:mod:`~servelab.server.protocol`: bounded JSON, validation, the chat template) and its response
side (:mod:`~servelab.server.responses`: choices, usage, server-sent events, OpenAI-shaped errors),
and the bridge (:mod:`~servelab.server.bridge`: the bounded queue, the one thread that owns the
engine, cancellation and backpressure; each request's bounded output stream and the backpressure
rule in :mod:`~servelab.server.streams`). What happens inside is exported at ``GET /metrics``
(:mod:`~servelab.server.metrics`, Prometheus, vLLM's metric names); :mod:`~servelab.server.demo`
holds what §1 and §2 show of it; :mod:`~servelab.server.soak` checks that its memory stays flat over
many requests. Start it with ``python -m servelab.server [--host 127.0.0.1] [--port 8000]``; in
tests and notebooks use :class:`BackgroundServer`.
"""

from servelab.server.app import BackgroundServer, create_app, render_chat
from servelab.server.bridge import EngineBridge, Overloaded, RequestStream
from servelab.server.config import DEFAULT_MODEL_NAME, ServerConfig
from servelab.server.gate import (
    ANONYMOUS,
    ERROR_TYPES,
    IngressGate,
    Rejection,
    TenantLimits,
    TokenBucket,
)
from servelab.server.metrics import ServerMetrics

__all__ = [
    "ANONYMOUS",
    "BackgroundServer",
    "DEFAULT_MODEL_NAME",
    "ERROR_TYPES",
    "EngineBridge",
    "IngressGate",
    "Overloaded",
    "Rejection",
    "RequestStream",
    "ServerConfig",
    "ServerMetrics",
    "TenantLimits",
    "TokenBucket",
    "create_app",
    "render_chat",
]
