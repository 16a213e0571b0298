"""Typed keys of the gateway's shared state (aiohttp ``AppKey``).

Everything that comes from the policy lives in the ``RUNTIME`` holder, swapped as a whole on
reload; what outlives a policy (the upstream session, metrics, the admission queue) has its
own key. The application object is aiohttp's, used as the typed state container
and lifecycle (cleanup contexts); the listener is kvgate's own HTTP server.
"""

from __future__ import annotations

from aiohttp import ClientSession, web
from opentelemetry.trace import Tracer

from gateway.base.metrics import GatewayMetrics
from gateway.control.canary.canaries import Canaries
from gateway.control.models.registry import ModelRegistry
from gateway.control.slo.tracker import SloTracker
from gateway.guards.admission import AdmissionQueue
from gateway.request.runtime import RuntimeHolder
from gateway.response_cache.cache import ResponseCache
from gateway.routing.shadow import ShadowMirror
from kvgate.response_homes import ResponseHomes
from kvgate.wire.http.connection_pool import ConnectionPool

RUNTIME = web.AppKey("runtime", RuntimeHolder)
HTTP_SESSION = web.AppKey("http_session", ClientSession)  # off the request path: shadows
UPSTREAMS = web.AppKey("upstreams", ConnectionPool)  # the proxied requests' connections
METRICS = web.AppKey("metrics", GatewayMetrics)
TRACER: web.AppKey[Tracer | None] = web.AppKey("tracer")
SHUTTING_DOWN = web.AppKey("shutting_down", list[bool])
ADMISSION = web.AppKey("admission", AdmissionQueue)
SHADOW = web.AppKey("shadow", ShadowMirror)
SLOS = web.AppKey("slos", SloTracker)
CANARIES = web.AppKey("canaries", Canaries)
MODELS = web.AppKey("models", ModelRegistry)
RESPONSE_HOMES = web.AppKey("response_homes", ResponseHomes)
RESPONSE_CACHE = web.AppKey("response_cache", ResponseCache)
