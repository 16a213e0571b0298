"""Where the policy keeps state that outlives a process (automatic canaries, the model
registry's stages): in Redis when the limits share one, so that every replica reads the same,
else in a file of the state directory, shared by one gateway's workers."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gateway.control.canary.redis_state import RedisStateStore
from gateway.control.canary.state import S, StateFile, Store, state_dir, state_file_name
from policies.schema import Policy

log = logging.getLogger("kvgate.gateway")


@dataclass(frozen=True)
class StatePlace:
    redis_url: str | None
    directory: Path | None  # None with Redis, or when no directory could be made

    def __str__(self) -> str:
        return f"redis {self.redis_url}" if self.redis_url else f"file {self.directory}"

    def store(self, kind: str, name: str, parse: Callable[[str], S]) -> Store[S] | None:
        """The store of ``kind``'s state for ``name`` (a route, a model); None: the state lasts
        this process only."""
        if self.redis_url:
            return RedisStateStore(self.redis_url, f"kvgate:{kind}:{name}", parse)
        if self.directory is not None:
            return StateFile(self.directory / state_file_name(name, kind), parse)
        return None


def state_place(policy: Policy) -> StatePlace:
    limit_store = policy.limits.store
    if limit_store.kind == "redis":
        return StatePlace(limit_store.url, None)
    path = state_dir(policy.state_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log.warning("state cannot be kept in %s (%s): it lasts this process only", path, exc)
        return StatePlace(None, None)
    return StatePlace(None, path)
