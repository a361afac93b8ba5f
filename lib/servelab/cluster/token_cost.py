"""What a token costs: dollars per million tokens from a GPU-hour price and a token rate.

A GPU is paid by the hour whether it is busy or not, so the cost of a token is the hourly price
over the tokens it produces in that hour: ``price / (3600 x tokens/s x utilisation) x 10^6`` per
million tokens. The same hour priced per request gives cost per 1,000 requests; the two agree when a
request's token count is the one the rate was measured with (:func:`cost_per_1000_requests`).

System boundary: steady state, one price per GPU-hour for the whole replica (all its GPUs), the
token rate the replica sustains within its SLO (a measured or published figure, stated by the
caller), and a utilisation for the hours it is not at that rate. Prompt and output tokens are
priced separately by hosted APIs; here ``tokens_per_s`` is whichever the caller counts.
"""

from __future__ import annotations

from servelab._validate import require_real

__all__ = ["cost_per_1000_requests", "cost_per_million_tokens"]


def cost_per_million_tokens(price_per_hour: float, tokens_per_s: float,
                            utilisation: float = 1.0) -> float:
    """Dollars per million tokens for a replica costing ``price_per_hour`` $/h that produces
    ``tokens_per_s`` tokens/s while busy and is busy a fraction ``utilisation`` of its hours."""
    price = require_real("price_per_hour", price_per_hour, 0)
    rate = require_real("tokens_per_s", tokens_per_s, 0, strict_min=True)
    busy = require_real("utilisation", utilisation, 0, 1, strict_min=True)
    return price / (3600 * rate * busy) * 1e6


def cost_per_1000_requests(price_per_hour: float, tokens_per_s: float, tokens_per_request: float,
                           utilisation: float = 1.0) -> float:
    """Dollars per 1,000 requests of ``tokens_per_request`` tokens each, on the same replica."""
    per_request = require_real("tokens_per_request", tokens_per_request, 0, strict_min=True)
    return cost_per_million_tokens(price_per_hour, tokens_per_s, utilisation) * per_request / 1e3
