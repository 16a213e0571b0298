"""Typed keys of the gateway's shared state (aiohttp ``AppKey``)."""

from __future__ import annotations

from aiohttp import ClientSession, web
from opentelemetry.trace import Tracer

from gateway.admission import AdmissionQueue
from gateway.auth import Authenticator
from gateway.breaker import RetryBudget
from gateway.limits.limiter import Limiter
from gateway.metrics import GatewayMetrics
from gateway.picker import EndpointState, Picker
from gateway.routing.shadow import ShadowMirror
from policies.schema import Policy

POLICY = web.AppKey("policy", Policy)
AUTHENTICATOR = web.AppKey("authenticator", Authenticator)
PICKER = web.AppKey("picker", Picker)
ENDPOINTS: web.AppKey[dict[str, list[EndpointState]]] = web.AppKey("endpoints")
HTTP_SESSION = web.AppKey("http_session", ClientSession)
METRICS = web.AppKey("metrics", GatewayMetrics)
TRACER: web.AppKey[Tracer | None] = web.AppKey("tracer")
SHUTTING_DOWN = web.AppKey("shutting_down", list[bool])
LIMITER = web.AppKey("limiter", Limiter)
RETRY_BUDGETS = web.AppKey("retry_budgets", dict[str, RetryBudget])
ADMISSION = web.AppKey("admission", AdmissionQueue)
SHADOW = web.AppKey("shadow", ShadowMirror)
