"""The gateway's one state holder, kept in the application under ``STATE``.

It holds the runtime of the policy in force (``current``: swapped whole on reload; a request
reads it once, when it arrives) and what outlives policies: the parts every runtime is built
with, the admission queue, the SLO tracker, the canaries, the model registry, the shadow
mirror and the response cache. The request path, the reloader and the admin API reach state
through it alone, as attributes (one application lookup per request).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aiohttp import web

from gateway.control.canary.canaries import Canaries
from gateway.control.models.registry import ModelRegistry
from gateway.control.slo.tracker import SloTracker
from gateway.guards.admission import AdmissionQueue
from gateway.request.runtime import Runtime, RuntimeParts
from gateway.response_cache.cache import ResponseCache
from gateway.routing.shadow import ShadowMirror
from kvgate.response_homes import ResponseHomes


@dataclass(eq=False)
class GatewayState:
    """Everything the gateway keeps (see the module's docstring)."""

    current: Runtime
    parts: RuntimeParts
    admission: AdmissionQueue
    slos: SloTracker
    canaries: Canaries
    models: ModelRegistry
    shadow: ShadowMirror
    response_cache: ResponseCache
    response_homes: ResponseHomes = field(default_factory=ResponseHomes)
    version: int = 1  # of the policy in force: 1 at start, one more each reload
    shutting_down: bool = False  # /readyz answers 503 from then on


STATE = web.AppKey("state", GatewayState)
