"""A routing decision anyone can read: the caller who asks with ``x-kvgate-explain: 1`` (where
the route's ``explain.tenants`` allow it) gets it in the response's ``x-kvgate-explain`` header
as compact JSON, and the access log records it; ``explain.sample`` of the route's requests are
explained in the access log only. Nothing is computed for the others."""

from __future__ import annotations

import random
from collections.abc import Mapping

import orjson

from gateway.routing.embedded_epp import EppRanking
from gateway.routing.endpoint_picker import Ranking
from policies.explain_section import Explain

HEADER = "x-kvgate-explain"
REPLY, LOG = "reply", "log"


def explain_mode(explain: Explain, headers: Mapping[str, str], tenant: str) -> str:
    """``reply`` (the caller asked and may), ``log`` (sampled) or "" (not explained)."""
    asked = headers.get(HEADER, "").lower() in ("1", "true")
    if asked and explain.allows(tenant):
        return REPLY
    return LOG if explain.sample and random.random() < explain.sample else ""


def explained(
    pool: str, ranking: Ranking, explain: Explain | None, tenant: str, mode: str
) -> tuple[dict[str, object], str | None]:
    """The decision (for the access log, in full) and, where the caller asked (``mode``
    ``reply``), the response header's value: cache matches only where ``explain`` shows them
    to ``tenant``."""
    decided: dict[str, object] = {"pool": pool}
    if isinstance(ranking, EppRanking):
        decided.update(ranking.explanation())
    else:
        decided["picker"] = "least-in-flight"  # no scores: the fewest requests in flight
    if mode != REPLY:
        return decided, None
    replied = decided
    if isinstance(ranking, EppRanking) and not (explain and explain.shows_matches(tenant)):
        replied = {"pool": pool, **ranking.explanation(matches=False)}
    return decided, orjson.dumps(replied).decode()


def sent_elsewhere(
    decided: dict[str, object], header: str | None, endpoint: str
) -> tuple[dict[str, object], str | None] | None:
    """The decision and header of a request sent to ``endpoint`` rather than the pick (its
    breaker open, or it refused): ``pick`` says where it went, ``first_choice`` the picker's
    first choice. None where it went to the pick."""
    if "pick" not in decided or decided["pick"] == endpoint:
        return None
    moved = {**decided, "first_choice": decided["pick"], "pick": endpoint}
    if header is None:
        return moved, None
    replied = orjson.loads(header)
    replied.update(first_choice=replied.get("pick"), pick=endpoint)
    return moved, orjson.dumps(replied).decode()
