"""The ``slos:`` section: service-level objectives per route (and optionally per priority
class), each a share of good events over a rolling window.

A latency objective such as ``ttft_p95: 500ms`` reads "95% of the route's successful requests
see their first token within 500 ms" (good: at or under the threshold); ``availability:
99.9%`` reads "99.9% of the route's requests are answered without a 5xx" (gateway-made errors
included; requests the client gave up on are not counted). An entry may start from a preset,
one per service class of the design (``interactive``, ``batch``, ``realtime``); an entry whose
``class`` names a preset and that sets no objective of its own takes that preset::

    slos:
      shed_when_exhausted: true     # off by default
      objectives:
        - route: chat
          class: interactive        # the interactive preset: TTFT p95 500 ms, TPOT p95 40 ms, 99.9%
        - route: "*"                # every route
          window: 7d
          ttft_p99: 2s
          availability: 99.5%
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import MappingProxyType

from policies.fields import Fields, child

SLIS = ("ttft", "tpot", "availability")
LATENCY_KEYS = tuple(f"{sli}_p{q}" for sli in ("ttft", "tpot") for q in (50, 90, 95, 99))
_LATENCY_KEY = re.compile(r"^(ttft|tpot)_p(\d\d)$")
_PERCENT = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*%\s*$")
DEFAULT_WINDOW = 28 * 86400.0


@dataclass(frozen=True)
class SloObjective:
    """One objective: the share ``target`` of events must be good; for latency SLIs an event
    is good when it takes at most ``threshold`` seconds."""

    name: str  # ttft_p95, tpot_p95, availability, ...
    sli: str  # ttft | tpot | availability
    target: float  # 0..1
    threshold: float = 0.0  # seconds (latency SLIs)


@dataclass(frozen=True)
class Slo:
    """The objectives of one route, or of one priority class of it."""

    route: str  # a public model
    priority_class: str | None  # None: every class of the route
    window: float  # seconds
    objectives: tuple[SloObjective, ...]

    @property
    def class_label(self) -> str:
        return self.priority_class or "all"


@dataclass(frozen=True)
class Slos:
    slos: tuple[Slo, ...] = ()
    # a route whose budget is spent refuses the classes below the objective's own class
    shed_when_exhausted: bool = False


def ttft_target(slos: Slos, route: str, priority_class: str) -> float | None:
    """The tightest TTFT threshold the objectives of ``route`` (or of every route) set for
    ``priority_class`` (or for every class); None if none sets one."""
    thresholds = [
        objective.threshold
        for slo in slos.slos
        if slo.route in (route, "*") and slo.priority_class in (priority_class, None)
        for objective in slo.objectives
        if objective.sli == "ttft"
    ]
    return min(thresholds, default=None)


def _latency(name: str, threshold: float) -> SloObjective:
    match = _LATENCY_KEY.match(name)
    assert match is not None
    return SloObjective(name, match.group(1), int(match.group(2)) / 100, threshold)


def _availability(target: float) -> SloObjective:
    return SloObjective("availability", "availability", target)


# the design's three service classes
PRESETS: MappingProxyType[str, tuple[SloObjective, ...]] = MappingProxyType(
    {
        "interactive": (
            _latency("ttft_p95", 0.5),
            _latency("tpot_p95", 0.04),
            _availability(0.999),
        ),
        "batch": (_latency("ttft_p95", 5.0), _availability(0.995)),
        "realtime": (_latency("ttft_p95", 0.3), _availability(0.9995)),
    }
)


def load_slos(top: Fields, routes: tuple[str, ...], classes: tuple[str, ...]) -> Slos:
    if not top.has("slos"):
        return Slos()
    f = top.sub("slos", {"objectives", "shed_when_exhausted"})
    out: list[Slo] = []
    seen: set[tuple[str, str | None, str]] = set()
    for path, item in f.items("objectives", required=True):
        s = Fields(
            f.source,
            item,
            path,
            {"route", "class", "preset", "window", "availability", *LATENCY_KEYS},
        )
        route = s.text("route")
        if route and route != "*" and route not in routes:
            s.error(
                child(path, "route"), f"{route!r} is not a routed model (or '*' for every route)"
            )
        priority_class = s.opt_str("class")
        if priority_class is not None and priority_class not in classes:
            s.error(child(path, "class"), f"unknown priority class {priority_class!r}")
        objectives = _objectives(s, path, priority_class)
        window = s.duration("window", DEFAULT_WINDOW)
        if window < 3600:
            s.error(child(path, "window"), "must be at least 1h")
        for name in routes if route == "*" else (route,):
            for objective in objectives:
                key = (name, priority_class, objective.name)
                if key in seen:
                    s.error(path, f"{objective.name} of route {name!r} is declared twice")
                seen.add(key)
            out.append(Slo(name, priority_class, window, objectives))
    return Slos(tuple(out), f.flag("shed_when_exhausted", False))


def _objectives(s: Fields, path: str, priority_class: str | None) -> tuple[SloObjective, ...]:
    preset_name = s.opt_str("preset")
    own = [key for key in ("availability", *LATENCY_KEYS) if s.has(key)]
    if preset_name is None and not own and priority_class in PRESETS:
        preset_name = priority_class
    chosen: dict[str, SloObjective] = {}
    if preset_name is not None:
        if preset_name not in PRESETS:
            s.error(
                child(path, "preset"), f"must be one of {', '.join(PRESETS)}; got {preset_name!r}"
            )
        for objective in PRESETS.get(preset_name, ()):
            chosen[objective.name] = objective
    for key in own:
        if key == "availability":
            chosen[key] = _availability(_share(s, key))
        else:
            threshold = s.duration(key)
            if threshold <= 0:
                s.error(child(path, key), "must be a positive duration")
            chosen[key] = _latency(key, threshold)
    if not chosen:
        s.error(path, "needs a preset or at least one objective (availability, ttft_p95, ...)")
    return tuple(chosen.values())


def _share(s: Fields, key: str) -> float:
    """A target share, from ``0.999`` or ``"99.9%"``; strictly between 0 and 1."""
    value = s.raw(key)
    share = -1.0
    if isinstance(value, str) and (match := _PERCENT.match(value)):
        share = float(match.group(1)) / 100
    elif isinstance(value, int | float) and not isinstance(value, bool):
        share = float(value)
    if not 0 < share < 1:
        s.error(
            child(s.path, key), f"must be a share like 99.9% or 0.999, below 100%; got {value!r}"
        )
        return 0.5
    return share
