"""A registered model's stages as saved: each version's stage, the canary run under way, the
versions production had before, and the latest changes — and the changes an operator (or the
canary's verdict) may make:

- ``promote``: staging → canary (the automatic canary against production starts), canary →
  production (production's version is archived), archived → staging;
- ``rollback``: canary → archived (everything back to production), production → archived with
  the version production had before it restored;
- ``archive``: staging or canary → archived (production is archived by a promotion or a
  rollback, never alone: a model always has a version in production).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field

from policies.models_section import STAGES, RegisteredModel

log = logging.getLogger("kvgate.gateway")

ACTIONS = ("promote", "rollback", "archive")
MAX_EVENTS = 20


class StageConflict(ValueError):
    """The action does not apply to the version's stage (the message says why)."""


@dataclass
class ModelStages:
    model: str
    stages: dict[str, str]  # version -> stage
    canary_run: str = ""  # "<version>@<started>" while a version is in canary
    history: list[str] = field(default_factory=list)  # production's earlier versions, in order
    generation: int = 0
    events: list[dict[str, object]] = field(default_factory=list)  # the latest changes

    def version_in(self, stage: str) -> str | None:
        return next((v for v, s in self.stages.items() if s == stage), None)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ModelStages:
        data = json.loads(text)
        stages = {str(v): str(s) for v, s in dict(data["stages"]).items()}
        if any(stage not in STAGES for stage in stages.values()):
            raise ValueError(f"unknown stage in {stages}")
        events = [e for e in data.get("events", []) if isinstance(e, dict)]
        history = [str(v) for v in data.get("history", [])]
        return cls(
            str(data["model"]),
            stages,
            str(data.get("canary_run", "")),
            history,
            int(data.get("generation", 0)),
            events,
        )


def in_force(
    model: RegisteredModel, saved: ModelStages | None, *, quiet: bool = False
) -> ModelStages:
    """The stages of the policy's versions: as saved where the saved state knows the version,
    as declared where it does not — except that a new version declared in production or canary
    while the saved stages have that stage taken enters as staging (with a warning, unless
    ``quiet``)."""
    declared = model.declared()
    if saved is None:
        canary = next((v for v, s in declared.items() if s == "canary"), None)
        return ModelStages(model.name, declared, f"{canary}@declared" if canary else "")
    stages = {v: saved.stages[v] for v in declared if v in saved.stages}
    for version, stage in declared.items():
        if version in stages:
            continue
        if stage in ("production", "canary") and stage in stages.values():
            log.log(
                logging.DEBUG if quiet else logging.WARNING,
                "model %s: version %s is declared %s, but the saved stages keep another there: "
                "it enters as staging (promote it to change that)",
                model.name,
                version,
                stage,
            )
            stage = "staging"
        stages[version] = stage
    if "production" not in stages.values():  # its saved version left the policy
        production = next(v for v, s in declared.items() if s == "production")
        level = logging.DEBUG if quiet else logging.WARNING
        log.log(level, "model %s: no saved version is in production; %s is", model.name, production)
        stages[production] = "production"
    run = saved.canary_run
    canary = next((v for v, s in stages.items() if s == "canary"), None)
    if canary is None:
        run = ""
    elif not run.startswith(f"{canary}@"):
        run = f"{canary}@declared"
    return ModelStages(
        model.name, stages, run, list(saved.history), saved.generation, list(saved.events)
    )


def change(state: ModelStages, version: str, action: str, now: float, by: str) -> dict[str, object]:
    """Apply ``action`` (one of ``ACTIONS``) to ``version`` in ``state``; the event recorded.
    Raises ``KeyError`` for a version the state does not know, ``StageConflict`` when the
    action does not apply to its stage."""
    if action not in ACTIONS:
        raise ValueError(f"unknown action {action!r} (expected: {', '.join(ACTIONS)})")
    before = state.stages[version]
    event: dict[str, object] = {"at": now, "version": version, "action": action, "by": by}
    if action == "promote":
        _promote(state, version, before, now)
    elif action == "rollback":
        event.update(_rollback(state, version, before))
    else:
        _archive(state, version, before)
    event.update({"from": before, "to": state.stages[version]})
    state.events = [*state.events, event][-MAX_EVENTS:]
    state.generation += 1
    return event


def _promote(state: ModelStages, version: str, stage: str, now: float) -> None:
    if stage == "staging":
        running = state.version_in("canary")
        if running is not None:
            raise StageConflict(
                f"version {running} is the canary: promote it or roll it back first"
            )
        state.stages[version] = "canary"
        state.canary_run = f"{version}@{now:.3f}"
    elif stage == "canary":
        production = state.version_in("production")
        if production is not None:
            state.stages[production] = "archived"
            state.history = [*state.history, production][-MAX_EVENTS:]
        state.stages[version] = "production"
        state.canary_run = ""
    elif stage == "archived":
        state.stages[version] = "staging"
    else:
        raise StageConflict(f"version {version} is already in production")


def _rollback(state: ModelStages, version: str, stage: str) -> dict[str, object]:
    if stage == "canary":
        state.stages[version] = "archived"
        state.canary_run = ""
        return {}
    if stage != "production":
        raise StageConflict(f"version {version} is {stage}: only a canary or production rolls back")
    running = state.version_in("canary")
    if running is not None:
        raise StageConflict(f"version {running} is a canary against it: roll that back first")
    earlier = [v for v in state.history if v != version and v in state.stages]
    if not earlier:
        raise StageConflict(f"no earlier production version of {state.model} to restore")
    restored = earlier[-1]
    state.history = [v for v in state.history if v != restored]
    state.stages[version] = "archived"
    state.stages[restored] = "production"
    return {"restored": restored}


def _archive(state: ModelStages, version: str, stage: str) -> None:
    if stage == "production":
        raise StageConflict(
            f"version {version} is in production: promote another version or roll it back"
        )
    if stage == "archived":
        raise StageConflict(f"version {version} is already archived")
    if stage == "canary":
        state.canary_run = ""
    state.stages[version] = "archived"
