"""The routing headers only an endpoint picker may set (GIE's and llm-d's names).

A client's copies are removed wherever a request enters: at the gateway's edge
(``gateway.request.upstream``) and by ext_proc (``epp.servers.ext_proc``), else a client could
choose its own endpoint or prefiller.
"""

from __future__ import annotations

DESTINATION = "x-gateway-destination-endpoint"
SERVED = "x-gateway-destination-endpoint-served"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
PREFILLER = "x-prefiller-host-port"  # llm-d's prefill target (the decode worker runs it)
PREFILLER_LLM_D = "x-llm-d-prefiller-host-port"  # its newer spelling
PREFILLER_HEADERS = (PREFILLER_LLM_D, PREFILLER)  # both are set, and either is read
# not a routing header: the client's name for its request's objective (GIE's
# InferenceObjective), which sets the request's priority and, in the gateway, may lower its class
INFERENCE_OBJECTIVE = "x-gateway-inference-objective"
CLIENT_ROUTING = frozenset({DESTINATION, SERVED, SUBSET_KEY, PREFILLER})
CLIENT_ROUTING_PREFIX = "x-llm-d-"  # llm-d's routing headers (prefill targets, ...)


def is_client_routing(name: str) -> bool:
    """Whether ``name`` (lower case) is a routing header a client must not send."""
    return name in CLIENT_ROUTING or name.startswith(CLIENT_ROUTING_PREFIX)
