"""A routing decision anyone can read: the caller who asks with ``x-kvgate-explain: 1`` (where
the route's ``explain.tenants`` allow it) gets it in the response's ``x-kvgate-explain`` header
as compact JSON, and the access log records it; ``explain.sample`` of the route's requests are
explained in the access log only. Nothing is computed for the others."""

from __future__ import annotations

import random
from collections.abc import Mapping

import orjson

from gateway.context import RequestContext
from gateway.embedded_epp import EppRanking
from gateway.endpoint_picker import Ranking
from policies.explain_section import Explain

HEADER = "x-kvgate-explain"
REPLY, LOG = "reply", "log"


def explain_mode(explain: Explain, headers: Mapping[str, str], ctx: RequestContext) -> str:
    """``reply`` (the caller asked and may), ``log`` (sampled) or "" (not explained)."""
    asked = headers.get(HEADER, "").lower() in ("1", "true")
    if asked and explain.allows(ctx.tenant):
        return REPLY
    return LOG if explain.sample and random.random() < explain.sample else ""


def record_explanation(ctx: RequestContext, pool: str, ranking: Ranking) -> None:
    """Keep the decision on ``ctx`` (for the access log) and, when the caller asked, in the
    response's header."""
    decided: dict[str, object] = {"pool": pool}
    if isinstance(ranking, EppRanking):
        decided.update(ranking.explanation())
    else:
        decided["picker"] = "least-in-flight"  # no scores: the fewest requests in flight
    ctx.explanation = decided
    if ctx.explain == REPLY:
        ctx.add_headers({HEADER: orjson.dumps(decided).decode()})
