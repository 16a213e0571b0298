"""The policy, as frozen dataclasses: built once by ``load_policy`` and passed in explicitly.

Later sections (priority classes, limits, breakers, canary / A-B / shadow routes, the endpoint
picker) are added as new fields with defaults, so existing policy files keep loading.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from policies.admin_section import Admin
from policies.cache_section import ResponseCacheStore, RouteCache
from policies.canary_section import AutoCanary
from policies.cors_section import Cors
from policies.explain_section import Explain
from policies.models_section import RegisteredModel
from policies.slo_section import Slos
from policies.spend_section import Spend

DEFAULT_CLASS = "standard"
ROLES = ("both", "prefill", "decode")
ENGINES = ("vllm", "sglang", "kvgate")
METRIC_OVERRIDES = ("waiting", "running", "kv_usage", "lora_info")  # pools.<name>.metrics keys
JWT_ALGORITHMS = (*[f"{k}{b}" for k in ("HS", "RS", "ES", "PS") for b in (256, 384, 512)], "EdDSA")


@dataclass(frozen=True)
class ServerTls:
    """A listener's TLS: its certificate chain and key (PEM files, reloaded when they change);
    with ``client_ca``, clients must present a certificate it signed (mutual TLS)."""

    cert: str
    key: str
    client_ca: str | None = None


@dataclass(frozen=True)
class ClientTls:
    """How a pool's ``https://`` endpoints are dialled: verified against ``ca`` (else the
    system's CAs) unless ``insecure_skip_verify``, with an optional client certificate."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    insecure_skip_verify: bool = False
    server_name: str | None = None  # the name the certificates must carry (default: the host)


@dataclass(frozen=True)
class Listen:
    host: str = "0.0.0.0"
    port: int = 8080
    workers: int = 1  # processes sharing the port (SO_REUSEPORT)
    max_body_bytes: int = 8 * 2**20  # larger request bodies get 413
    max_json_depth: int = 64  # request bodies nested deeper get 400
    shutdown_grace: float = 30.0  # seconds in-flight streams may finish after SIGTERM
    header_timeout: float = 30.0  # seconds a client may take to send a request's head (408)
    body_timeout: float = 60.0  # seconds a client may take to send a request's body (408)
    # proxies whose X-Forwarded-For is believed (addresses or CIDR networks): the client address
    # in logs is then the chain's last untrusted entry instead of the connection's peer
    trusted_proxies: tuple[str, ...] = ()
    admin: Admin | None = None  # no admin API unless configured
    ready_with_dead_pools: bool = True  # /readyz: 200 "degraded" (True) or 503 (False)
    tls: ServerTls | None = None  # HTTPS (and mutual TLS) on the data listener


@dataclass(frozen=True)
class ApiKey:
    sha256: str  # hex digest of the key; the key itself is never stored
    tenant: str
    priority_class: str | None = None  # None: the tenant's class, else "standard"
    models: tuple[str, ...] | None = None  # public models allowed; None: the tenant's, else all
    name: str = ""  # a label for logs and metrics (never the key)


@dataclass(frozen=True)
class JwtIssuer:
    issuer: str
    jwks_file: str  # "" when the keys come from jwks_url
    algorithms: tuple[str, ...]  # pinned: a token signed with any other algorithm is rejected
    audience: str | None = None
    tenant_claim: str = "tenant"
    class_claim: str = "class"
    models_claim: str | None = None
    leeway: float = 0.0  # seconds of clock skew tolerated on exp / nbf
    jwks_url: str | None = None  # fetched and kept fresh (gateway.guards.remote_jwks)


@dataclass(frozen=True)
class Auth:
    api_keys: tuple[ApiKey, ...] = ()
    jwt: tuple[JwtIssuer, ...] = ()
    allow_anonymous: bool = True  # defaults to true only when no key and no issuer is set
    anonymous_tenant: str = "anonymous"


@dataclass(frozen=True)
class Tenant:
    name: str
    priority_class: str | None = None
    models: tuple[str, ...] | None = None


@dataclass(frozen=True)
class EndpointSpec:
    """One model server as the policy lists it (the gateway's ``EndpointState`` and the EPP's
    ``Endpoint`` are its live views)."""

    address: str  # host:port
    role: str = "both"  # both | prefill | decode
    tls: bool = False  # listed as https://host:port
    labels: Mapping[str, str] = field(default_factory=dict)
    kv_events_port: int | None = None  # overrides the pool's kv_events.port for this endpoint
    kv_events_topic: str | None = None  # kv_events.bind: the topic this engine publishes on
    kv_events_replay_port: int | None = None  # overrides the pool's kv_events.replay_port (0: none)
    # its load against an endpoint of capacity 1: one of 3 carries 3 times the requests in
    # flight, queue and token backlog before it counts as equally loaded (mixed hardware)
    capacity: float = 1.0

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.address}"


@dataclass(frozen=True)
class Pool:
    name: str
    endpoints: tuple[EndpointSpec, ...]
    model: str | None = None  # the upstream model name requests are rewritten to
    engine: str = "vllm"  # metric names the picker scrapes: vllm | sglang | kvgate
    api_key: str | None = None  # sent upstream as a bearer token (clients' keys never are)
    adapters: tuple[str, ...] = ()  # LoRA adapters served here; a request for one prefers residents
    # adapters the gateway loads itself where their requests go
    # (``gateway.routing.adapter_placement``): name -> the path the engines load it from; at most
    # ``max_adapters`` on an endpoint at once
    adapter_paths: Mapping[str, str] = field(default_factory=dict)
    max_adapters: int = 4
    kv_events_port: int | None = None  # the endpoints' KV-event port, for precise prefix routing
    kv_events_bind: str | None = None  # or a ZMQ address the EPP binds and the engines connect to
    # the engines' replay (ROUTER) port: None, the events port + 1 (kvgate backend's default; vLLM's
    # replay_endpoint); 0, none
    kv_events_replay_port: int | None = None
    pd_min_uncached_tokens: int | None = None  # prefill/decode pools: when to add a prefill pick
    pd_max_prefill_in_flight: int | None = None  # a prefill endpoint with this many hops busy
    max_concurrency: int | None = None  # requests in flight per gateway process; more are queued
    max_model_len: int | None = None  # the engines' context length: caps a request's token estimate
    # endpoints' capacities measured from their decode speed
    # (``epp.datalayer.measured_capacity``) rather than read from the policy
    measured_capacity: bool = False
    tls: ClientTls = field(default_factory=ClientTls)  # for its https:// endpoints
    metric_names: Mapping[str, str] = field(default_factory=dict)  # METRIC_OVERRIDES -> name
    # whether the engines answer vLLM's return_token_ids (then a broken stream is continued
    # from the exact tokens; else from its text); None: by ``engine`` (vllm, kvgate: yes)
    token_ids: bool | None = None
    # seconds the engines keep an agent's blocks after an answer that calls a tool (a kv.retain
    # hint on requests that offer tools); 0: no hints
    kv_retention: float = 0.0
    # completions' text prompts sent as the precise index's token ids (engines tokenize no more)
    tokenized_prompts: bool = False

    @property
    def returns_token_ids(self) -> bool:
        return self.token_ids if self.token_ids is not None else self.engine != "sglang"


@dataclass(frozen=True)
class PluginSpec:
    name: str  # how profiles refer to it
    type: str  # a registered plugin type, e.g. prefix-cache-scorer
    params: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class ProfileRef:
    ref: str
    weight: float | None = None  # scorers only; None means 1.0


@dataclass(frozen=True)
class ProfileSpec:
    name: str
    plugins: tuple[ProfileRef, ...]


DEFAULT_EPP_PLUGINS = (
    PluginSpec("adapters", "placed-adapter-filter"),
    PluginSpec("backlog", "token-backlog-scorer"),
    PluginSpec("prefix", "prefix-cache-scorer"),
    PluginSpec("spread", "cold-spread-scorer"),
    PluginSpec("active", "active-request-scorer"),
    PluginSpec("lora", "lora-affinity-scorer"),
    PluginSpec("session", "session-affinity-scorer"),
    PluginSpec("pick", "max-score-picker"),
)
# Sticky until the backlog outweighs a miss: a request goes where its prefix is cached (prefix
# x3) until the tokens of work queued there, plus what it would compute there, exceed the cost
# of computing its whole prompt elsewhere and it has the most requests in flight (backlog x2, in
# the request's own tokens, with active x1 it cancels prefix x3); a new prefix
# goes where the caches hold least and its LoRA adapter fits (spread x2); the picker's own
# in-flight count breaks ties (active x1); a conversation's next turn goes where its last turn
# went (session x2: its history is cached there even when the prefix index has let go of it).
# Where the gateway loads a pool's LoRA adapters itself, a request for one keeps to the
# unsaturated endpoints holding it (the adapters filter; a no-op otherwise).
# Neither GIE's queue x2 and KV x2 beside prefix x3, nor a saturation filter, nor a filter on
# in-flight counts (8 more than the least loaded and twice as many) is kept: under load each
# diverted warm requests often enough that the misses added load and affinity collapsed
# (docs/benchmarks.md, "Routing"). Saturation still gates admission (requests wait while every
# endpoint is saturated) and ext_proc's shedding.
DEFAULT_EPP_PROFILES = (
    ProfileSpec(
        "default",
        (
            ProfileRef("adapters"),
            ProfileRef("backlog", 2),
            ProfileRef("prefix", 3),
            ProfileRef("spread", 2),
            ProfileRef("active", 1),
            ProfileRef("lora", 1),
            ProfileRef("session", 2),
            ProfileRef("pick"),
        ),
    ),
)


@dataclass(frozen=True)
class Saturation:
    """When an endpoint counts as saturated (GIE's utilization detector defaults): its waiting
    queue (plus requests sent since the last scrape, not over yet) at ``queue_depth``, KV usage
    at ``kv_usage``, or metrics older than ``max_metrics_age`` seconds. One setting, read by the
    ``saturation-filter``, the gateway's admission gate and ext_proc's shedding."""

    queue_depth: int = 5
    kv_usage: float = 0.8  # 0..1
    max_metrics_age: float = 0.2  # seconds


@dataclass(frozen=True)
class Objective:
    """An inference objective (GIE's ``InferenceObjective``), named by a request's
    ``x-gateway-inference-objective`` header: a priority below 0 makes its requests sheddable
    (answered 429 by ext_proc while every endpoint is saturated)."""

    name: str
    priority: int = 0
    # the gateway's admission class for its requests, when lighter than the caller's own
    priority_class: str | None = None


PICK_OPEN_TIMEOUT = 300.0  # seconds: ``Epp.pick_open_timeout``'s default


@dataclass(frozen=True)
class Replicas:
    """Picker replicas (gateways or ``kvgate epp``s, on any host) that share what they learn
    from their picks through a Redis stream, so that they route as one."""

    store: str  # redis://host:port/db
    key: str = "kvgate:picks"  # the stream; replicas of one deployment name the same
    history: int = 20_000  # entries (a round trip's picks each) kept for a replica to catch up on
    timeout: float = 1.0  # seconds a call to the store may take before it counts as down


SAMPLE_CANDIDATES = 16  # the default (a compiled dataclass's class has no field defaults)


@dataclass(frozen=True)
class Epp:
    """The endpoint picker: GIE-like plugins and profiles.

    ``picker: least-in-flight`` turns it off (the gateway's simple picker is used instead).
    """

    picker: str = "epp"  # epp | least-in-flight
    plugins: tuple[PluginSpec, ...] = DEFAULT_EPP_PLUGINS
    profiles: tuple[ProfileSpec, ...] = DEFAULT_EPP_PROFILES
    scrape_interval: float = 0.05
    # an endpoint whose metrics show only this picker's own requests, far from saturation (an
    # idle one, say), is polled this often instead, and so is a busy one whose metrics no pick
    # has read since its last scrape; 0 polls every endpoint at scrape_interval
    scrape_idle_interval: float = 0.2
    # how far that slow polling stretches (doubling) while scrape after scrape finds only this
    # picker's own requests there; at most this late is other routers' new traffic seen
    scrape_quiet_interval: float = 1.0
    saturation: Saturation = field(default_factory=Saturation)
    objectives: tuple[Objective, ...] = ()  # unknown objectives have priority 0
    # how long a Pick API pick the caller never reports Finished counts as in flight (longer
    # than the longest response the callers stream)
    pick_open_timeout: float = PICK_OPEN_TIMEOUT
    replicas: Replicas | None = None  # None: this picker learns from its own picks only
    # where this picker runs: endpoints labelled with the same zone (region) are nearest
    zone: str = ""
    region: str = ""
    # a pool with more endpoints scores this many per pick (``epp.scheduling.candidate_sample``)
    sample_candidates: int = SAMPLE_CANDIDATES

    def priority_of(self, objective: str) -> int:
        """The priority of the named objective (0 when the policy does not list it)."""
        return next((o.priority for o in self.objectives if o.name == objective), 0)

    def class_of(self, objective: str) -> str | None:
        """The admission class the named objective maps to (None: none, or not listed)."""
        return next((o.priority_class for o in self.objectives if o.name == objective), None)


@dataclass(frozen=True)
class LimitRule:
    """Token buckets for the requests a ``match`` selects.

    Each match field is a value (only that one) or ``*`` (one bucket per distinct value);
    fields left out do not split the bucket.
    """

    name: str
    match: Mapping[str, str]  # tenant | api_key | model | route -> value or "*"
    requests_per_min: int | None = None
    tokens_per_min: int | None = None


@dataclass(frozen=True)
class LimitStore:
    kind: str = "memory"  # memory | redis
    url: str | None = None
    timeout: float = 0.02  # per Redis call; then the failure policy applies
    on_failure: str = "fail_open"  # fail_open: enforce this replica's share locally | fail_closed
    replicas: int = 1  # gateway replicas sharing the limit (sizes the fail-open share)


@dataclass(frozen=True)
class Limits:
    store: LimitStore = field(default_factory=LimitStore)
    rules: tuple[LimitRule, ...] = ()
    default_max_tokens: int = 512  # reserved for output when a request sets no max_tokens
    chars_per_token: int = 4  # prompt estimate at admission


@dataclass(frozen=True)
class PriorityClass:
    """A class of the admission queue: served in proportion to ``weight`` under saturation;
    its streams may be paused up to ``max_pauses`` times each for a heavier class's requests;
    a queued request must start within ``deadline`` seconds of its arrival (or the route's TTFT
    objective for the class: ``deadline_objective``), else it is refused."""

    name: str
    weight: float
    max_queue: int = 1000  # queued requests beyond this are refused (429)
    max_wait: float = 30.0  # seconds a request may wait before it is given up (503)
    max_pauses: int = 0  # 0: never paused
    deadline: float | None = None  # None: none, unless the client sends one
    deadline_objective: bool = False


DEFAULT_CLASSES = {
    "interactive": PriorityClass("interactive", 6, 1000, 5.0),
    "standard": PriorityClass("standard", 3, 5000, 30.0),
    "batch": PriorityClass("batch", 1, 20000, 600.0),
}


@dataclass(frozen=True)
class WeightedPool:
    pool: str
    weight: float  # canary: relative weight; A/B: basis points (all arms sum to 10,000)
    name: str = ""  # the A/B arm's name (defaults to the pool)


@dataclass(frozen=True)
class AbTest:
    name: str
    key: str  # "user" (the body's ``user`` field) or "header:<name>"
    arms: tuple[WeightedPool, ...]


@dataclass(frozen=True)
class Shadow:
    pool: str
    sample: float  # share of requests copied, 0..1
    compare: tuple[str, ...] = ("status", "tokens", "latency")  # also: text
    max_in_flight: int = 4  # shadow requests at once per process; more are dropped


@dataclass(frozen=True)
class Route:
    """A public model name and where its requests go: one pool, a canary split or an A/B test;
    optionally shadowed, with fallback models when its pools cannot serve."""

    model: str  # the public model name clients send
    pool: str  # the pool (for a split: the first one)
    canary: tuple[WeightedPool, ...] = ()
    ab_test: AbTest | None = None
    shadow: Shadow | None = None
    fallback: tuple[str, ...] = ()  # other public models, tried in order
    # more upstream paths this model's requests may take, passed through unchanged (JSON
    # bodies naming the model; authenticated, limited and metered like the OpenAI ones)
    paths: tuple[str, ...] = ()
    auto_canary: AutoCanary | None = None  # the canary's weight is the gateway's to advance
    resume: bool = True  # a stream whose engine fails is continued on another (retries.resumes)
    cache: RouteCache | None = None  # deterministic answers are kept (response_cache)
    explain: Explain | None = None  # who may read the routing decision, and a logged share


@dataclass(frozen=True)
class Timeouts:
    connect: float = 2.0
    first_byte: float = 60.0  # until the upstream's response headers
    idle: float = 30.0  # longest gap between two chunks of a response


@dataclass(frozen=True)
class Retries:
    attempts: int = 2  # extra tries on another endpoint, only before the first byte
    backoff: float = 0.025  # base delay, doubled per attempt, with full jitter
    max_backoff: float = 0.5
    budget_ratio: float = 0.2  # retries may add at most this share of a pool's requests
    min_retries_per_second: float = 3.0  # retries always allowed at this rate (low traffic)
    resumes: int = 2  # times a stream broken mid-answer is continued on another endpoint


@dataclass(frozen=True)
class Breakers:
    """Per-endpoint circuit breakers."""

    consecutive_failures: int = 5  # open after this many failures in a row
    failure_ratio: float = 0.5  # or when this share of the window's requests failed
    window: float = 30.0  # seconds of outcomes the ratio looks at
    min_requests: int = 20  # the ratio needs at least this many outcomes in the window
    cool_down: float = 10.0  # open for this long, then half-open
    half_open_probes: int = 2  # requests let through half-open; all must succeed to close


@dataclass(frozen=True)
class Tracing:
    exporter: str = "none"  # none | console | otlp
    endpoint: str | None = None  # OTLP/HTTP endpoint, e.g. http://127.0.0.1:4318/v1/traces
    sample: float = 1.0
    service_name: str = "kvgate"


@dataclass(frozen=True)
class Observability:
    metrics_path: str = "/metrics"
    # who may read metrics_path on the data listener: loopback peers, anyone presenting
    # ``Authorization: Bearer <metrics_token>``, or everyone with ``metrics_public``
    metrics_token: str | None = None
    metrics_public: bool = False
    tracing: Tracing = field(default_factory=Tracing)
    access_log: str = "json"  # json | off


@dataclass(frozen=True)
class Policy:
    pools: Mapping[str, Pool]
    routes: tuple[Route, ...]
    version: int = 1
    listen: Listen = field(default_factory=Listen)
    auth: Auth = field(default_factory=Auth)
    tenants: Mapping[str, Tenant] = field(default_factory=dict)
    timeouts: Timeouts = field(default_factory=Timeouts)
    retries: Retries = field(default_factory=Retries)
    breakers: Breakers = field(default_factory=Breakers)
    observability: Observability = field(default_factory=Observability)
    epp: Epp = field(default_factory=Epp)
    limits: Limits = field(default_factory=Limits)
    classes: Mapping[str, PriorityClass] = field(default_factory=lambda: dict(DEFAULT_CLASSES))
    cors: Cors | None = None  # browsers' cross-origin calls: refused unless configured
    slos: Slos = field(default_factory=Slos)
    response_cache: ResponseCacheStore = field(default_factory=ResponseCacheStore)
    spend: Spend = field(default_factory=Spend)  # prices and budgets
    models: Mapping[str, RegisteredModel] = field(default_factory=dict)  # the registry
    # where state that outlives a process is kept (automatic canaries); "" is
    # $KVGATE_STATE_DIR, else $XDG_STATE_HOME/kvgate (~/.local/state/kvgate)
    state_dir: str = ""
    source: str = "<policy>"
    # worked out once, in __post_init__ (every request reads them; compiled, a
    # cached_property would work them out on each read): the first route of each model, and
    # every route's extra ``paths`` (each request is checked against its own route's)
    _routes_by_model: dict[str, Route] = field(init=False, repr=False, compare=False)
    passthrough_paths: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        found: dict[str, Route] = {}
        for route in self.routes:
            found.setdefault(route.model, route)
        object.__setattr__(self, "_routes_by_model", found)
        paths = frozenset(p for route in self.routes for p in route.paths)
        object.__setattr__(self, "passthrough_paths", paths)

    def route_for(self, model: str) -> Route | None:
        return self._routes_by_model.get(model)

    @property
    def public_models(self) -> tuple[str, ...]:
        return tuple(route.model for route in self.routes)
