"""The shared-view benchmark against a real redis-server: replicas in another process publish
and learn each other's picks, and the figures it reports add up."""

from __future__ import annotations

import argparse

from bench.shared_view import one_rate
from loadtest.harness.redis_server import RedisServer


def test_every_replica_learns_every_other_replicas_picks(redis_server: RedisServer) -> None:
    args = argparse.Namespace(replicas=3, processes=1, seconds=1.0, keys=8)
    figures = one_rate(redis_server, args, 40.0)
    assert figures["offered_per_s"] == 120.0
    assert figures["sent_per_s"] >= 100 and figures["dropped"] == 0
    assert 0.95 <= figures["learnt_share"] <= 1.0  # each pick reaches the two others
    assert 0 < figures["lag_p50_ms"] <= figures["lag_p99_ms"] < 1000
    assert figures["bytes_in_per_pick"] > 8 * 8  # the keys travel
    assert figures["bytes_out_per_pick"] > figures["bytes_in_per_pick"]  # read by two
