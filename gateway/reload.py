"""Hot reload: a valid change of the policy file (or of a JWKS file it names) applies
atomically, an invalid one is rejected with its errors logged and the old policy kept.
In-flight requests finish on the runtime they started with. A change of the model registry's
stages applies the same way: the policy as declared, resolved with the stages now.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import replace

from aiohttp import web

from epp.scheduling.registry import CATALOG
from gateway.guards.admission_gate import (
    AdmissionGate,
    AllGates,
    ConcurrencyGate,
    SaturationGate,
    in_flight_counts,
)
from gateway.guards.remote_jwks import jwks_urls
from gateway.request.runtime import Runtime, RuntimeParts, build_runtime
from gateway.request.state import STATE
from policies.errors import PolicyError
from policies.loader import load_policy
from policies.schema import Listen, Policy

log = logging.getLogger("kvgate.gateway")
RETIRE_AFTER = 60.0  # seconds before a replaced limiter is closed (its reservations settle)


def admission_gate(runtime: Runtime, previous: AdmissionGate | None = None) -> AdmissionGate:
    """The admission queue's gate for ``runtime``: each pool's concurrency cap (the counts of
    the ``previous`` gate carried over) and, with the embedded EPP, its saturation (the EPP's
    own detector: the policy's ``epp.saturation``)."""
    pools = runtime.policy.pools
    limits = {n: p.max_concurrency for n, p in pools.items()}
    gate: AdmissionGate = ConcurrencyGate(limits, in_flight_counts(previous))
    if runtime.embedded is not None:
        service = runtime.embedded.service
        saturation = SaturationGate(
            service.datastore.endpoints, service.saturation, service.scraper.metrics_read
        )
        gate = AllGates(gate, saturation)
    return gate


def _stamp_of(path: str) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (stat.st_mtime_ns, stat.st_size)


class Reloader:
    """Watches the policy file and applies each valid change as a new runtime."""

    def __init__(
        self, app: web.Application, path: str | None, parts: RuntimeParts, declared: Policy
    ) -> None:
        self.app = app
        self.path = path
        self.parts = parts
        self.declared = declared  # the policy as loaded, before the registry's stages
        self._stamp = self._file_stamp()
        self._retiring: set[asyncio.Task[None]] = set()
        self._applying = asyncio.Lock()  # a file's reload and a change of stages, in turn

    def _file_stamp(self) -> tuple[object, ...] | None:
        """The policy file's (mtime, size), with those of the JWKS files it names: a key added
        to or removed from a JWKS file reloads the policy too."""
        if self.path is None:
            return None
        policy = _stamp_of(self.path)
        if policy is None:
            return None
        jwks = [c.jwks_file for c in self.app[STATE].current.policy.auth.jwt if c.jwks_file]
        return (policy, *(_stamp_of(path) for path in jwks))

    async def watch(self, interval: float = 1.0) -> None:
        while True:
            await asyncio.sleep(interval)
            stamp = self._file_stamp()
            if stamp is not None and stamp != self._stamp:
                await self.reload()
                self._stamp = self._file_stamp()  # the JWKS files of the policy now in force

    async def reload(self) -> tuple[bool, list[str]]:
        """Load the policy file again; (applied, errors)."""
        metrics = self.parts.metrics
        if self.path is None:
            return False, ["the gateway was started without a policy file"]
        try:
            policy = load_policy(self.path, plugins=CATALOG)
        except PolicyError as exc:
            metrics.child(metrics.reloads, "rejected").inc()
            log.error("policy reload rejected, keeping the current policy:\n%s", exc)
            return False, exc.errors
        try:
            await self.apply(policy)
        except Exception as exc:  # a bug in applying must neither stop the watcher nor the gateway
            log.exception("policy reload failed; keeping the current policy")
            metrics.child(metrics.reloads, "failed").inc()
            return False, [f"internal error while applying the policy: {exc}"]
        metrics.child(metrics.reloads, "applied").inc()
        return True, []

    async def apply(self, policy: Policy) -> None:
        """Run ``policy`` (as loaded) from now on, with the model registry's stages."""
        models = self.app[STATE].models
        async with self._applying:
            await asyncio.to_thread(models.update, policy)  # its saved stages: file or Redis
            self.declared = policy
            await self._apply(models.resolve(policy))

    async def apply_stages(self) -> None:
        """The policy as loaded again, with the model registry's stages as they are now."""
        async with self._applying:
            await self._apply(self.app[STATE].models.resolve(self.declared))

    async def _apply(self, policy: Policy) -> None:
        state = self.app[STATE]
        old = state.current
        if _listeners(policy.listen) != _listeners(old.policy.listen):
            log.warning(
                "listen settings changed: the listeners apply them after a restart (the admin "
                "API's keys, roles and audit log apply now)"
            )
        await self.parts.key_sets.fetch_new(jwks_urls(policy))  # before its tokens arrive
        new = build_runtime(policy, self.parts, previous=old)
        if new.limiter is not old.limiter:
            await new.limiter.start()
        if new.embedded is not None and new.embedded is not old.embedded:
            await new.embedded.start()
        admission = state.admission
        admission.update(dict(policy.classes), admission_gate(new, admission.gate))
        state.current = new
        state.version += 1
        state.slos.update(policy)
        state.canaries.update(policy)
        state.response_cache.update(policy)
        log.info("policy version %d applied from %s", state.version, policy.source)
        if old.embedded is not None and old.embedded is not new.embedded:
            await old.embedded.stop()
        if old.limiter is not new.limiter:
            task = asyncio.create_task(self._retire(old))
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    async def _retire(self, old: Runtime) -> None:
        await asyncio.sleep(RETIRE_AFTER)
        await old.limiter.close()

    async def close(self) -> None:
        for task in list(self._retiring):
            task.cancel()


def _listeners(listen: Listen) -> tuple[Listen, tuple[str, int] | None]:
    """What of ``listen`` only a restart applies: all of it but who may call the admin API."""
    admin = listen.admin
    return replace(listen, admin=None), None if admin is None else (admin.host, admin.port)


RELOADER = web.AppKey("reloader", Reloader)
