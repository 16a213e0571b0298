"""An automatic canary's state (its step, status and decisions), kept in a small JSON file so
that it survives a restart and is shared by the workers of one gateway (the model registry's
stages are kept the same way: ``StateFile`` holds any state that writes itself as JSON).

Every change is a read-modify-write under an exclusive ``flock`` of ``<file>.lock``, and the
file is replaced atomically; ``generation`` counts the changes, so a worker that sees a newer
one adopts it. One worker judges the canary: the one holding ``<file>.judge`` (taken without
waiting, held for the process's life, passed on when that process exits).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Generic, Protocol, TypeVar

log = logging.getLogger("kvgate.gateway")

STATUSES = ("waiting", "running", "paused", "promoted", "rolled_back")
MAX_EVENTS = 20


@dataclass
class CanaryState:
    fingerprint: str  # the policy's canary this state belongs to (AutoCanary.fingerprint)
    step_started: float  # wall-clock seconds
    step: int = 0  # index into the steps
    status: str = "running"
    generation: int = 0
    events: list[dict[str, object]] = field(default_factory=list)  # the latest decisions

    def record(self, event: dict[str, object]) -> None:
        self.events = [*self.events, event][-MAX_EVENTS:]
        self.generation += 1

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> CanaryState:
        data = json.loads(text)
        state = cls(str(data["fingerprint"]), float(data["step_started"]))
        state.step = int(data.get("step", 0))
        state.status = str(data.get("status", "running"))
        state.generation = int(data.get("generation", 0))
        events = data.get("events", [])
        state.events = (
            [e for e in events if isinstance(e, dict)] if isinstance(events, list) else []
        )
        if state.status not in STATUSES:
            raise ValueError(f"unknown status {state.status!r}")
        return state


class Saved(Protocol):
    def to_json(self) -> str: ...


S = TypeVar("S", bound=Saved)


class Store(Protocol[S]):
    """Where a state is kept: a local file (``StateFile``) or Redis
    (``gateway.control.canary.redis_state``)."""

    def load(self) -> S | None: ...

    def update(self, change: Callable[[S | None], S | None]) -> S | None: ...

    def is_judge(self) -> bool: ...

    def close(self) -> None: ...


CanaryStore = Store[CanaryState]


def apply_change(
    current: S | None, change: Callable[[S | None], S | None]
) -> tuple[S | None, bool]:
    """``change`` applied to the saved state: (the result, whether it is to be written: it is
    a state, and not the one it was given unchanged)."""
    before = current.to_json() if current is not None else None
    changed = change(current)
    return changed, changed is not None and changed.to_json() != before


def parse_saved(parse: Callable[[str], S], text: str, where: object) -> S | None:
    """A saved state, or None (with a warning) when it cannot be read."""
    try:
        return parse(text)
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring the unreadable saved state %s: %s", where, exc)
        return None


def state_file_name(model: str, kind: str = "canary") -> str:
    return f"{kind}-" + re.sub(r"[^A-Za-z0-9._-]", "_", model) + ".json"


class StateFile(Generic[S]):
    """One state's file (and its lock and judge files); ``parse`` reads what ``to_json``
    wrote."""

    def __init__(self, path: Path, parse: Callable[[str], S]) -> None:
        self.path = path
        self.parse = parse
        self._judge: IO[bytes] | None = None

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with open(f"{self.path}.lock", "ab") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _read(self) -> S | None:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        return parse_saved(self.parse, text, self.path)

    def _write(self, state: S) -> None:
        temporary = self.path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(state.to_json())
        os.replace(temporary, self.path)

    def load(self) -> S | None:
        with self._locked():
            return self._read()

    def update(self, change: Callable[[S | None], S | None]) -> S | None:
        """Apply ``change`` to the saved state under the lock; what it returns is saved (and
        returned), unless it is the very state it was given unchanged or None."""
        with self._locked():
            changed, write = apply_change(self._read(), change)
            if changed is not None and write:
                self._write(changed)
            return changed

    def is_judge(self) -> bool:
        """Whether this process judges the canary (taking the role when it is free)."""
        if self._judge is not None:
            return True
        handle = open(f"{self.path}.judge", "ab")  # noqa: SIM115 (held while the process lives)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            return False
        self._judge = handle
        return True

    def close(self) -> None:
        if self._judge is not None:
            self._judge.close()
            self._judge = None


def state_dir(configured: str) -> Path:
    """The policy's ``state_dir``, else ``$KVGATE_STATE_DIR``, else ``$XDG_STATE_HOME/kvgate``
    (``~/.local/state/kvgate``)."""
    if configured:
        return Path(configured)
    if os.environ.get("KVGATE_STATE_DIR"):
        return Path(os.environ["KVGATE_STATE_DIR"])
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "kvgate"
