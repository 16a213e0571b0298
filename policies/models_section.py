"""The ``models:`` section: a registry of each public model's versions and their stages, as
MLflow's model registry keeps them (staging → canary → production → archived)::

    models:
      chat:
        canary: {steps: [10, 50, 100], hold: 10m, min_requests: 200}   # as canary.auto
        versions:
          - version: "3"
            pool: chat-v3                # where this version is served
            stage: production            # the stage until an operator changes it
            path: /models/chat/3         # what the engines load (recorded, not read)
            framework: vllm
            precision: bf16
            checksum: sha256:9f86d08...
          - {version: "4", pool: chat-v4, stage: staging}

A registered model is routed like any public model; its route (one of ``routes:``, or one the
registry adds) takes its pool from the version in production, and a version in ``canary`` is
that route's automatic canary against production. Stage changes made through the admin API
(``kvgate models``) are saved and outlive restarts and reloads (``gateway.control.models``).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field

from policies.canary_section import AUTO_FIELDS, AutoCanary, load_auto
from policies.fields import Fields, child

STAGES = ("staging", "canary", "production", "archived")
_CHECKSUM = re.compile(r"^(sha256:[0-9a-f]{64}|sha512:[0-9a-f]{128})$")
VERSION_FIELDS = {"version", "pool", "stage", "path", "framework", "precision", "checksum"}


@dataclass(frozen=True)
class ModelVersion:
    version: str
    pool: str
    stage: str  # as declared: the stage until an operator changes it
    path: str = ""  # storage path of the weights
    framework: str = ""  # e.g. vllm, sglang, transformers
    precision: str = ""  # e.g. bf16, fp8, awq-int4
    checksum: str = ""  # sha256:<hex> or sha512:<hex> of the weights


@dataclass(frozen=True)
class RegisteredModel:
    name: str  # the public model name
    versions: tuple[ModelVersion, ...]
    # how a version in ``canary`` is judged against production (baseline and pool unset)
    canary: AutoCanary = field(default_factory=lambda: AutoCanary("", ""))

    def version(self, version: str) -> ModelVersion | None:
        return next((v for v in self.versions if v.version == version), None)

    def declared(self) -> dict[str, str]:
        """Each version's declared stage."""
        return {v.version: v.stage for v in self.versions}


def load_models(top: Fields, pools: Collection[str]) -> dict[str, RegisteredModel]:
    """``models:``, each version's pool one of ``pools``."""
    models: dict[str, RegisteredModel] = {}
    for path, name, item in top.entries("models"):
        m = Fields(top.source, item, path, {"versions", "canary"})
        versions = tuple(_version(m, p, v, pools) for p, v in m.items("versions", required=True))
        if m.has("versions") and not versions:
            m.error(child(path, "versions"), "needs at least one version")
        names = [v.version for v in versions]
        for duplicate in sorted({n for n in names if names.count(n) > 1}):
            m.error(child(path, "versions"), f"version {duplicate!r} is listed twice")
        stages = [v.stage for v in versions]
        if versions and stages.count("production") != 1:
            m.error(child(path, "versions"), "needs exactly one version in production")
        if stages.count("canary") > 1:
            m.error(child(path, "versions"), "may have one version in canary at a time")
        canary = load_auto(m.sub("canary", AUTO_FIELDS), "", "")
        models[str(name)] = RegisteredModel(str(name), versions, canary)
    return models


def _version(m: Fields, path: str, item: object, pools: Collection[str]) -> ModelVersion:
    v = Fields(m.source, item, path, VERSION_FIELDS)
    raw = v.raw("version")
    if isinstance(raw, int) and not isinstance(raw, bool):  # version: 3
        v.data = {**v.data, "version": str(raw)}
    if "/" in str(v.raw("version") or ""):
        v.error(child(path, "version"), "must not contain '/' (it names the version in URLs)")
    pool = v.text("pool")
    if pool and pool not in pools:
        known = ", ".join(sorted(pools)) or "none"
        v.error(child(path, "pool"), f"unknown pool {pool!r} (pools: {known})")
    checksum = v.opt_str("checksum") or ""
    if checksum and not _CHECKSUM.match(checksum):
        v.error(child(path, "checksum"), "must be sha256:<64 hex> or sha512:<128 hex>")
    return ModelVersion(
        v.text("version"),
        pool,
        v.text("stage", "staging", choices=STAGES),
        v.opt_str("path") or "",
        v.opt_str("framework") or "",
        v.opt_str("precision") or "",
        checksum,
    )
