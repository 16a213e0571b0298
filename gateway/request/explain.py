"""A routing decision anyone can read: the caller who asks with ``x-kvgate-explain: 1`` (where
the route's ``explain.tenants`` allow it) gets it in the response's ``x-kvgate-explain`` header
as compact JSON, and the access log records it; ``explain.sample`` of the route's requests are
explained in the access log only. Nothing is computed for the others."""

from __future__ import annotations

import random
from collections.abc import Mapping

import orjson

from gateway.base.context import RequestContext
from gateway.routing.embedded_epp import EppRanking
from gateway.routing.endpoint_picker import Ranking
from policies.explain_section import Explain

HEADER = "x-kvgate-explain"
REPLY, LOG = "reply", "log"


def explain_mode(explain: Explain, headers: Mapping[str, str], ctx: RequestContext) -> str:
    """``reply`` (the caller asked and may), ``log`` (sampled) or "" (not explained)."""
    asked = headers.get(HEADER, "").lower() in ("1", "true")
    if asked and explain.allows(ctx.tenant):
        return REPLY
    return LOG if explain.sample and random.random() < explain.sample else ""


def record_explanation(
    ctx: RequestContext, pool: str, ranking: Ranking, explain: Explain | None
) -> None:
    """Keep the decision on ``ctx`` (for the access log, in full) and, when the caller asked,
    in the response's header (cache matches only where ``explain`` shows them to the caller)."""
    decided: dict[str, object] = {"pool": pool}
    if isinstance(ranking, EppRanking):
        decided.update(ranking.explanation())
    else:
        decided["picker"] = "least-in-flight"  # no scores: the fewest requests in flight
    ctx.explanation = decided
    if ctx.explain != REPLY:
        return
    replied = decided
    if isinstance(ranking, EppRanking) and not (explain and explain.shows_matches(ctx.tenant)):
        replied = {"pool": pool, **ranking.explanation(matches=False)}
    ctx.add_headers({HEADER: orjson.dumps(replied).decode()})


def record_destination(ctx: RequestContext, endpoint: str) -> None:
    """Where the request was sent: the explanation's ``pick``, and the picker's first choice
    as ``first_choice`` when that was skipped (its breaker open, or it refused)."""
    decided = ctx.explanation
    if decided is None or "pick" not in decided or decided["pick"] == endpoint:
        return
    decided["first_choice"], decided["pick"] = decided["pick"], endpoint
    header = (ctx.extra_headers or {}).get(HEADER)
    if header is not None:
        replied = orjson.loads(header)
        replied["first_choice"], replied["pick"] = replied.get("pick"), endpoint
        ctx.add_headers({HEADER: orjson.dumps(replied).decode()})
