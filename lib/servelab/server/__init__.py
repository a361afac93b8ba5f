"""An OpenAI-compatible streaming server on the course engine.

Layers, outermost first: the ingress gate (:mod:`~servelab.server.gate`: body size, tenant, rate,
quota -- before tokenization), the HTTP application (:mod:`~servelab.server.app`: parsing, validation,
server-sent events), and the bridge (:mod:`~servelab.server.bridge`: the bounded queue, the one thread
that owns the engine, cancellation and backpressure). Start it with
``python -m servelab.server [--host 127.0.0.1] [--port 8000]``; in tests and notebooks use
:class:`BackgroundServer`.
"""

from servelab.server.app import DEFAULT_MODEL_NAME, BackgroundServer, ServerConfig, create_app, render_chat
from servelab.server.bridge import EngineBridge, Overloaded, RequestStream
from servelab.server.gate import ANONYMOUS, IngressGate, Rejection, TenantLimits, TokenBucket

__all__ = ["ANONYMOUS", "BackgroundServer", "DEFAULT_MODEL_NAME", "EngineBridge", "IngressGate", "Overloaded",
           "Rejection", "RequestStream", "ServerConfig", "TenantLimits", "TokenBucket", "create_app", "render_chat"]
