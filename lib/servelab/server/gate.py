"""The ingress gate: the cheap checks a request must pass before the server tokenizes it.

Phase 1 of two-phase admission. It looks only at coarse signals that need no tokenizer and no
engine state: the size of the body, who is asking (the tenant behind the API key), whether that
tenant is sending too fast (a token bucket) and whether it has used up its token quota for the
current window. Phase 2 (exact prompt length, context limit, KV fit, queue room) happens after
tokenization, in :mod:`servelab.server.app` and :mod:`servelab.server.bridge`.

A refused request raises :class:`Rejection`, which carries the HTTP status and, for the "try later"
answers (429), a ``Retry-After`` in seconds that says when trying again can succeed.

System boundary: the gate sees HTTP headers and counts; it is used from the server's event-loop
thread only (not thread-safe). Times are seconds on ``clock`` (monotonic by default).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

__all__ = ["ERROR_TYPES", "Rejection", "TokenBucket", "TenantLimits", "IngressGate", "ANONYMOUS"]

ANONYMOUS = "anonymous"  # the tenant of every request when the server runs without API keys
ERROR_TYPES = (
    "invalid_request_error",
    "authentication_error",
    "permission_error",
    "not_found_error",
    # OpenAI's ``error.type`` values that this server uses
    "rate_limit_error",
    "server_error",
)


class Rejection(Exception):
    """A request refused with an HTTP ``status``; ``retry_after_s`` is set for "try again later"
    answers.

    ``error_type`` is one of OpenAI's error types (:data:`ERROR_TYPES`); ``param`` names the
    offending request field when there is one; ``code`` is a short machine-readable reason (a
    string) or None.
    """

    def __init__(
        self,
        status: int,
        message: str,
        error_type: str,
        retry_after_s: float | None = None,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        if error_type not in ERROR_TYPES:
            raise ValueError(f"error_type must be one of {ERROR_TYPES}, got {error_type!r}")
        self.status = status
        self.message = message
        self.error_type = error_type
        self.retry_after_s = retry_after_s
        self.param = param
        self.code = code


def _check_positive(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


class TokenBucket:
    """Allows ``rate_per_s`` events per second on average and bursts of up to ``burst`` at once.

    The bucket holds up to ``burst`` tokens and refills continuously at ``rate_per_s``; an event
    takes one token. A full bucket after a quiet spell is what lets a burst through.
    """

    def __init__(
        self, rate_per_s: float, burst: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate_per_s = _check_positive("rate_per_s", rate_per_s)
        self.burst = _check_positive("burst", burst)
        if self.burst < 1:
            raise ValueError(f"burst must be >= 1 (one request must fit), got {burst!r}")
        self._clock = clock
        self._tokens = self.burst
        self._updated = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._updated) * self.rate_per_s)
        self._updated = now

    def try_take(self) -> float:
        """Take one token: returns 0.0 on success, else the seconds until one will be available."""
        self._refill()
        if self._tokens >= 1:
            self._tokens -= 1
            return 0.0
        return (1 - self._tokens) / self.rate_per_s


@dataclass(frozen=True)
class TenantLimits:
    """One tenant's limits: request rate (requests/s, burst) and a token quota per window.

    ``token_quota`` bounds prompt + completion tokens charged in each ``quota_window_s`` (fixed
    windows from the tenant's first request); None means no quota.
    """

    requests_per_s: float = 20.0
    burst: float = 40.0
    token_quota: int | None = None
    quota_window_s: float = 3600.0

    def __post_init__(self) -> None:
        _check_positive("requests_per_s", self.requests_per_s)
        _check_positive("burst", self.burst)
        _check_positive("quota_window_s", self.quota_window_s)
        if self.token_quota is not None and (
            isinstance(self.token_quota, bool)
            or not isinstance(self.token_quota, int)
            or self.token_quota < 1
        ):
            raise ValueError(f"token_quota must be None or an int >= 1, got {self.token_quota!r}")


class _Tenant:
    """Per-tenant state: its bucket and its quota window."""

    def __init__(self, limits: TenantLimits, clock: Callable[[], float]) -> None:
        self.limits = limits
        self.bucket = TokenBucket(limits.requests_per_s, limits.burst, clock)
        self.window_start = clock()
        self.used_tokens = 0


class IngressGate:
    """Body size, API key -> tenant, per-tenant rate limit and token quota, checked in that order.

    ``api_keys`` maps an API key to a tenant name; with None the server is open and every request
    belongs to :data:`ANONYMOUS`. ``limits`` applies to every tenant unless ``per_tenant`` names it.
    """

    def __init__(
        self,
        api_keys: Mapping[str, str] | None = None,
        limits: TenantLimits | None = None,
        per_tenant: Mapping[str, TenantLimits] | None = None,
        max_body_bytes: int = 64 * 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if api_keys is not None:
            if not isinstance(api_keys, Mapping) or not api_keys:
                raise ValueError(
                    "api_keys must be None or a non-empty mapping of API key -> tenant name"
                )
            for key, tenant in api_keys.items():
                if not (isinstance(key, str) and key and isinstance(tenant, str) and tenant):
                    raise ValueError(
                        "api_keys must map non-empty str keys to non-empty str tenant names"
                    )
        self.api_keys = dict(api_keys) if api_keys is not None else None
        self.limits = TenantLimits() if limits is None else limits
        if not isinstance(self.limits, TenantLimits):
            raise TypeError("limits must be a TenantLimits")
        self.per_tenant = dict(per_tenant or {})
        if not all(isinstance(v, TenantLimits) for v in self.per_tenant.values()):
            raise TypeError("per_tenant must map tenant names to TenantLimits")
        if (
            isinstance(max_body_bytes, bool)
            or not isinstance(max_body_bytes, int)
            or max_body_bytes < 1
        ):
            raise ValueError(f"max_body_bytes must be an int >= 1, got {max_body_bytes!r}")
        self.max_body_bytes = max_body_bytes
        self._clock = clock
        self._tenants: dict[str, _Tenant] = {}

    def admit(self, authorization: str | None, content_length: int | None) -> str:
        """Run every phase-1 check; returns the tenant name or raises :class:`Rejection`.

        ``authorization`` is the raw ``Authorization`` header, ``content_length`` the declared body
        size in bytes (None when the client streams the body; the server then enforces the limit
        while reading).
        """
        if content_length is not None and content_length > self.max_body_bytes:
            raise self.body_too_large()
        tenant = self._tenant_of(authorization)
        state = self._state(tenant)
        self._check_quota(tenant, state)
        wait = state.bucket.try_take()
        if wait > 0:
            raise Rejection(
                429,
                f"tenant {tenant!r} exceeds {state.limits.requests_per_s:g} requests/s "
                f"(burst {state.limits.burst:g}); retry in {wait:.2f} s",
                "rate_limit_error",
                retry_after_s=wait,
                code="rate_limit_exceeded",
            )
        return tenant

    def body_too_large(self) -> Rejection:
        """The 413 answer for a body over ``max_body_bytes``."""
        return Rejection(
            413,
            f"request body exceeds {self.max_body_bytes} bytes",
            "invalid_request_error",
            code="request_too_large",
        )

    def charge(self, tenant: str, tokens: int) -> None:
        """Add ``tokens`` (prompt + completion, as reported in usage) to ``tenant``'s current
        window."""
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            raise ValueError(f"tokens must be an int >= 0, got {tokens!r}")
        state = self._state(tenant)
        self._roll_window(state)
        state.used_tokens += tokens

    def used_tokens(self, tenant: str) -> int:
        """Tokens charged to ``tenant`` in its current quota window."""
        state = self._state(tenant)
        self._roll_window(state)
        return state.used_tokens

    def _tenant_of(self, authorization: str | None) -> str:
        if self.api_keys is None:
            return ANONYMOUS
        scheme, _, key = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise Rejection(
                401,
                "missing API key: send 'Authorization: Bearer <key>'",
                "authentication_error",
                code="missing_api_key",
            )
        tenant = self.api_keys.get(key.strip())
        if tenant is None:
            raise Rejection(401, "unknown API key", "authentication_error", code="invalid_api_key")
        return tenant

    def _state(self, tenant: str) -> _Tenant:
        if tenant not in self._tenants:
            self._tenants[tenant] = _Tenant(self.per_tenant.get(tenant, self.limits), self._clock)
        return self._tenants[tenant]

    def _roll_window(self, state: _Tenant) -> None:
        window = state.limits.quota_window_s
        elapsed = self._clock() - state.window_start
        if elapsed >= window:
            state.window_start += window * math.floor(elapsed / window)
            state.used_tokens = 0

    def _check_quota(self, tenant: str, state: _Tenant) -> None:
        quota = state.limits.token_quota
        self._roll_window(state)
        if quota is not None and state.used_tokens >= quota:
            reset = state.window_start + state.limits.quota_window_s - self._clock()
            raise Rejection(
                429,
                f"tenant {tenant!r} used its quota of {quota} tokens for this window; "
                f"it resets in {reset:.0f} s",
                "rate_limit_error",
                retry_after_s=reset,
                code="quota_exceeded",
            )
