"""The shared view at scale: ``python -m bench.shared_view``.

``--replicas`` replicas' ends of the shared pick stream (``epp.requestcontrol.shared_picks``,
the code a gateway runs), spread over ``--processes`` processes (one asyncio loop each), against
one fresh redis-server on this machine. Each replica publishes picks at an offered rate (each a
real ``SiblingPick``: an endpoint, its placed tokens and the block keys of a trace-sized prompt,
``--keys`` of them) and follows every other replica's, for ``--seconds`` per rate. Per rate:
picks sent and learnt per second (against what was offered), the view's lag (from a pick's
publish to its arrival at another replica, p50/p99, milliseconds), Redis's CPU and bytes in and
out per pick published, the replica processes' CPU per pick learnt, and picks dropped.
Loopback, bounded in time; the replicas' CPU here is what one host's share of it costs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import random
import time
from typing import Any

import redis

from epp.requestcontrol.pick_exchange import SiblingPick
from epp.requestcontrol.shared_picks import SharedPicks
from loadtest.harness.proc_stats import cpu_seconds
from loadtest.harness.processes import free_port
from loadtest.harness.redis_server import RedisServer
from loadtest.reports.stats import percentile
from policies.schema import Replicas


def _pick(rng: random.Random, keys: int) -> SiblingPick:
    """A pick of a trace-sized prompt; its session carries when it was published."""
    chain = [rng.getrandbits(63) for _ in range(keys)]
    address = f"10.0.{rng.randrange(4)}.{rng.randrange(250)}:8000"
    return SiblingPick(address, rng.randrange(2000), None, [(1, chain)], f"{time.time():.6f}")


async def _replicas(
    url: str, count: int, rate: float, seconds: float, keys: int, seed: int
) -> dict[str, Any]:
    lags: list[float] = []

    def learnt(pick: SiblingPick, _age: float) -> None:
        lags.append(time.time() - float(pick.session))

    settings = Replicas(url, key="bench:picks", history=20_000)
    ends = [SharedPicks(settings, learnt) for _ in range(count)]
    for end in ends:
        await end.start()
    rng = random.Random(seed)
    lags.clear()
    cpu = time.process_time()
    began = time.perf_counter()
    published = 0
    while (elapsed := time.perf_counter() - began) < seconds:
        due = int(elapsed * rate)
        while published < due:
            for end in ends:
                end.publish(_pick(rng, keys))
            published += 1
        await asyncio.sleep(0.002)
    await asyncio.sleep(0.5)  # what is on its way arrives
    result = {
        "sent": sum(e.sent for e in ends),
        "received": sum(e.received for e in ends),
        "dropped": sum(e.dropped for e in ends),
        "lags": lags,
        "cpu": time.process_time() - cpu,  # this process's, while it published and learnt
    }
    for end in ends:
        await end.stop()
    return result


def _process(args: tuple[str, int, float, float, int, int], out: Any) -> None:
    out.put(asyncio.run(_replicas(*args)))


def server_pid(server: RedisServer) -> int:
    assert server.proc is not None
    return server.proc.pid


def one_rate(server: RedisServer, args: argparse.Namespace, rate: float) -> dict[str, float]:
    client = redis.Redis.from_url(server.url)
    client.delete("bench:picks")
    before = client.info("stats")
    redis_cpu = cpu_seconds(server_pid(server))
    per = args.replicas // args.processes
    queue: Any = multiprocessing.get_context("spawn").Queue()
    procs = [
        multiprocessing.get_context("spawn").Process(
            target=_process, args=((server.url, per, rate, args.seconds, args.keys, n), queue)
        )
        for n in range(args.processes)
    ]
    for proc in procs:
        proc.start()
    parts = [queue.get() for _ in procs]
    replica_cpu = sum(p["cpu"] for p in parts)
    for proc in procs:
        proc.join()
    redis_cpu = cpu_seconds(server_pid(server)) - redis_cpu
    after = client.info("stats")
    sent = sum(p["sent"] for p in parts)
    received = sum(p["received"] for p in parts)
    lags = [lag * 1000 for p in parts for lag in p["lags"]]
    replicas = per * args.processes
    return {
        "offered_per_s": rate * replicas,
        "sent_per_s": sent / args.seconds,
        "learnt_per_s": received / args.seconds,
        "learnt_share": received / max(1, sent * (replicas - 1)),
        "lag_p50_ms": percentile(lags, 50) if lags else float("nan"),
        "lag_p99_ms": percentile(lags, 99) if lags else float("nan"),
        "redis_cpu_us_per_pick": redis_cpu * 1e6 / max(1, sent),
        "redis_cpu_share": redis_cpu / args.seconds,
        "bytes_in_per_pick": (after["total_net_input_bytes"] - before["total_net_input_bytes"])
        / max(1, sent),
        "bytes_out_per_pick": (after["total_net_output_bytes"] - before["total_net_output_bytes"])
        / max(1, sent),
        "replica_cpu_us_per_learnt": replica_cpu * 1e6 / max(1, received),
        "dropped": float(sum(p["dropped"] for p in parts)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--replicas", type=int, default=16)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--rate", type=float, action="append", help="picks/s per replica")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--keys", type=int, default=60, help="block keys per pick")
    args = parser.parse_args()
    server = RedisServer(free_port()).start()
    rows = []
    try:
        for rate in args.rate or [62.5, 250.0, 1000.0]:
            rows.append((rate, one_rate(server, args, rate)))
            print(json.dumps({"rate": rate, **rows[-1][1]}), flush=True)
    finally:
        server.stop()
    print(
        f"\n## The shared view: {args.replicas} replicas in {args.processes} processes, "
        f"one redis-server, {args.seconds:g} s per rate, {args.keys} keys a pick\n"
    )
    print(
        "| picks/s per replica | offered /s | sent /s | learnt /s (share) | lag p50 ms "
        "| lag p99 ms | Redis CPU µs/pick | Redis CPU | bytes in / out per pick "
        "| replica CPU µs/learnt | dropped |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|")
    for rate, r in rows:
        print(
            f"| {rate:g} | {r['offered_per_s']:,.0f} | {r['sent_per_s']:,.0f} "
            f"| {r['learnt_per_s']:,.0f} ({r['learnt_share']:.0%}) | {r['lag_p50_ms']:.1f} "
            f"| {r['lag_p99_ms']:.1f} | {r['redis_cpu_us_per_pick']:.1f} "
            f"| {r['redis_cpu_share']:.0%} | {r['bytes_in_per_pick']:,.0f} / "
            f"{r['bytes_out_per_pick']:,.0f} | {r['replica_cpu_us_per_learnt']:.1f} "
            f"| {r['dropped']:,.0f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
