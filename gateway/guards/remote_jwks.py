"""JWKS fetched from an issuer's ``jwks_url`` (pyjwt's ``PyJWKClient``), kept fresh off the
request path.

Each URL's key set is fetched before the gateway serves, refreshed every ``REFRESH_EVERY``
seconds, and refreshed early when a token names a key id the set does not hold (a rotation),
at most once every ``MIN_REFRESH_GAP`` seconds however many such tokens arrive. Fetches run in
a worker thread (``PyJWKClient`` uses urllib): the event loop never waits on the issuer. A
failed fetch keeps the last good set. The sets outlive policy reloads (one ``RemoteKeySets``
per gateway), so a reload does not wait for a fetch either.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable

import jwt

from policies.schema import Policy

log = logging.getLogger("kvgate.auth")

REFRESH_EVERY = 300.0  # seconds between scheduled fetches of a key set
MIN_REFRESH_GAP = 10.0  # seconds: the fastest a key-id miss may make a fetch happen again
FETCH_TIMEOUT = 5.0  # seconds for one fetch

KeyEntry = tuple[jwt.PyJWK, str | None]  # the key and the algorithm its JWK names, if any


def parse_jwks(data: object) -> dict[str | None, KeyEntry]:
    """A JWKS document's keys by key id; ``ValueError`` when it holds none."""
    raw_keys = data.get("keys") if isinstance(data, dict) else None
    if not isinstance(raw_keys, list) or not raw_keys:
        raise ValueError("not a JWKS object with a non-empty 'keys' list")
    return {
        raw.get("kid"): (jwt.PyJWK.from_dict(raw), raw.get("alg"))
        for raw in raw_keys
        if isinstance(raw, dict)
    }


def jwks_urls(policy: Policy) -> list[str]:
    """The ``jwks_url`` of each of the policy's JWT issuers that has one."""
    return [issuer.jwks_url for issuer in policy.auth.jwt if issuer.jwks_url]


class RemoteKeySet:
    """One issuer URL's keys by key id, and when they were last fetched."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.keys: dict[str | None, KeyEntry] = {}
        self.fetched_at = 0.0  # time.monotonic() of the last good fetch; 0: never
        self.attempted_at = 0.0
        self.missed_at = 0.0  # when a key-id miss last made a fetch happen
        self.fetches = 0  # attempts, good or not
        self._client = jwt.PyJWKClient(url, cache_jwk_set=False, timeout=int(FETCH_TIMEOUT))
        self._task: asyncio.Task[None] | None = None

    async def refresh(self) -> None:
        """Fetch the set now (in a worker thread); keep the old keys if that fails."""
        self.attempted_at = time.monotonic()
        self.fetches += 1
        try:
            data = await asyncio.to_thread(self._client.fetch_data)
            keys = parse_jwks(data)
        except (jwt.PyJWKClientError, jwt.PyJWKError, OSError, ValueError) as exc:
            log.error("cannot fetch the JWKS at %s: %s", self.url, exc)
            return
        self.keys = keys
        self.fetched_at = time.monotonic()

    def missed(self, kid: object) -> None:
        """A token named ``kid``, which the set lacks: fetch again soon (rate limited)."""
        if self.missed_at and time.monotonic() - self.missed_at < MIN_REFRESH_GAP:
            return
        if self._task is not None and not self._task.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self.missed_at = time.monotonic()
        self._task = loop.create_task(self.refresh())


class RemoteKeySets:
    """Every ``jwks_url`` of the gateway's policies, fetched and kept fresh."""

    def __init__(self) -> None:
        self._sets: dict[str, RemoteKeySet] = {}
        self._task: asyncio.Task[None] | None = None

    def get(self, url: str) -> RemoteKeySet:
        found = self._sets.get(url)
        if found is None:
            found = self._sets[url] = RemoteKeySet(url)
        return found

    async def fetch_new(self, urls: Iterable[str]) -> None:
        """Fetch the sets of ``urls`` that were never fetched (before a policy is served)."""
        fresh = [self.get(u) for u in urls if not self.get(u).fetched_at]
        await asyncio.gather(*(s.refresh() for s in fresh))

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._keep_fresh())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _keep_fresh(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_EVERY / 10)
            now = time.monotonic()
            due = [s for s in self._sets.values() if now - s.attempted_at >= REFRESH_EVERY]
            await asyncio.gather(*(s.refresh() for s in due))
