"""What the precise index loses is counted: gaps, restarts and clears (everything known of an
endpoint forgotten), unkeyed stores, malformed and undecodable messages (logged once per
endpoint and reason, counted every time), and the EPP's metrics expose them."""

from __future__ import annotations

import logging

import pytest

from epp.datalayer.indexes.precise import KVEventHooks, PreciseIndex
from epp.datalayer.indexes.precise_cache import PrecisePrefixCache
from epp.datalayer.kv_events import KVEventSubscriber
from epp.framework import Endpoint, EndpointMetadata
from epp.metrics import exposition
from epp.service import EppService
from kvgate.wire.kv_events import BlockStored, encode_batch
from policies.loader import load_policy_text

A, B = "127.0.0.1:1", "127.0.0.1:2"


def stored(hashes: list[int], parent: int | None) -> list[object]:
    return ["BlockStored", hashes, parent, list(range(4 * len(hashes))), 4, None, "GPU", None]


class Heard:
    def __init__(self) -> None:
        self.resets: list[tuple[str, str]] = []
        self.unusable: list[tuple[str, str]] = []

    def hooks(self) -> KVEventHooks:
        return KVEventHooks(
            unusable=lambda e, r: self.unusable.append((e, r)),
            reset=lambda e, r: self.resets.append((e, r)),
        )


def test_resets_and_unkeyed_stores_reach_the_hooks() -> None:
    heard = Heard()
    index = PreciseIndex(hooks=heard.hooks())
    index.apply_batch(A, 0, [stored([1], None)])
    index.apply_batch(A, 3, [])  # batches 1 and 2 lost
    index.apply_batch(A, 0, [])  # the engine started again
    index.apply_batch(A, 1, [["AllBlocksCleared"]])
    index.apply_batch(B, 0, [stored([7], 12345)])  # a parent never seen
    assert heard.resets == [(A, "gap"), (A, "restart"), (A, "cleared")]
    assert heard.unusable == [(B, "unkeyed")]


async def test_unusable_messages_are_counted_each_time_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    heard = Heard()
    subscriber = KVEventSubscriber(
        PreciseIndex(hooks=heard.hooks()), [Endpoint(EndpointMetadata(A, "p", kv_events_port=1))]
    )
    endpoint = subscriber.endpoints[0]
    with caplog.at_level(logging.WARNING, logger="epp.datalayer.kv_events"):
        for seq in range(3):
            await subscriber.handle(endpoint, [b"t", seq.to_bytes(8, "big"), b"\xc1"])
        await subscriber.handle(endpoint, [b"t", b"short", b""])
        good = encode_batch([BlockStored([1], None, list(range(4)), 4, None)], 1.0)
        await subscriber.handle(endpoint, [b"t", (0).to_bytes(8, "big"), good])
    assert heard.unusable == [(A, "undecodable")] * 3 + [(A, "malformed")]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2 and "undecodable" in warnings[0] and "malformed" in warnings[1]
    assert subscriber.batches == 1  # a good batch after bad ones is still applied


def test_the_epp_exposes_what_its_precise_index_lost() -> None:
    service = EppService(
        load_policy_text(
            f"""
pools:
  p: {{endpoints: [{{address: "{A}", kv_events_port: 5557}}]}}
routes: [{{model: m, pool: p}}]
epp:
  plugins:
    - {{name: prefix, type: prefix-cache-scorer, params: {{mode: precise}}}}
    - {{name: pick, type: max-score-picker}}
  profiles: [{{name: default, plugins: [{{ref: prefix}}, {{ref: pick}}]}}]
"""
        )
    )
    index = service.handle.primary_index
    assert isinstance(index, PrecisePrefixCache)
    precise = index.index
    precise.apply_batch(A, 0, [stored([1], None)])
    precise.apply_batch(A, 5, [stored([2], 99)])
    text = exposition(service.metrics.registry).decode()
    assert f'kvgate_epp_kv_event_resets_total{{endpoint="{A}",reason="gap"}} 1.0' in text
    assert f'kvgate_epp_kv_events_unusable_total{{endpoint="{A}",reason="unkeyed"}} 1.0' in text
