"""The picker's cost of reading the engines' KV events: `make bench-kv-events`.

Eight publishers (``backends.kv_publisher.ZmqEventPublisher``, vLLM's wire format) in one
process send a seeded stream like an engine step's: a quarter of the batches store a run of
blocks (a prefill), the rest one block (a decode filling a block), some with a removal, at a
fixed total rate. A subscriber process, on uvloop, reads them one of two ways and reports its
own CPU time per batch (every thread: ZMQ's I/O thread too):

- ``floor``: a reader callback on each socket's descriptor that receives every queued message
  and does nothing with it, the least a Python subscriber on ZMQ can spend;
- ``kvgate``: the EPP's ``KVEventSubscriber`` feeding a ``PreciseIndex`` (decode, key, apply).

Rounds alternate the two, each in a fresh process; the table gives medians and the ratio
within each round.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import resource
import statistics
import subprocess
import sys
import time

import uvloop
import zmq

from loadtest.harness.processes import free_port

PUBLISHERS = 8
BLOCK = 16


def publish(ports: list[int], batches: int, rate: float, run_blocks: int) -> None:
    """Send ``batches`` batches round-robin over ``ports`` at ``rate`` per second."""
    from backends.kv_publisher import ZmqEventPublisher
    from kvgate.wire.kv_events import BlockRemoved, BlockStored, KVEvent

    publishers = [ZmqEventPublisher(f"tcp://127.0.0.1:{p}", bind=True) for p in ports]
    time.sleep(1.5)  # the subscriber connects (PUB/SUB's slow joiner)
    rng = random.Random(7)
    last = [0] * len(publishers)
    started = time.perf_counter()
    for i in range(batches):
        k = i % len(publishers)
        blocks = run_blocks if rng.random() < 0.25 else 1
        hashes = [last[k] + j + 1 for j in range(blocks)]
        tokens = [rng.randrange(32_000) for _ in range(BLOCK * blocks)]
        events: list[KVEvent] = [BlockStored(hashes, last[k] or None, tokens, BLOCK, None)]
        last[k] += blocks
        if rng.random() < 0.3 and last[k] > 4_000:
            events.append(BlockRemoved([last[k] - 4_000]))
        publishers[k].publish(events)
        delay = started + (i + 1) / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
    time.sleep(0.5)


async def subscribe(mode: str, ports: list[int], batches: int) -> dict[str, float]:
    """Read ``batches`` batches from ``ports`` the ``mode`` way; CPU from the first on."""
    from epp.datalayer.indexes.precise import KVEventHooks, PreciseIndex
    from epp.datalayer.kv_events import KVEventSubscriber, has_message
    from epp.framework import Endpoint, EndpointMetadata

    first, last = asyncio.Event(), asyncio.Event()
    received = 0

    def count(*_: object) -> None:
        nonlocal received
        received += 1
        first.set()
        if received >= batches:
            last.set()

    subscriber: KVEventSubscriber | None = None
    if mode == "floor":
        loop = asyncio.get_running_loop()
        for port in ports:
            socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.SUB)
            socket.setsockopt(zmq.SUBSCRIBE, b"")
            socket.connect(f"tcp://127.0.0.1:{port}")

            def drain(socket: zmq.Socket[bytes] = socket) -> None:
                while has_message(socket):  # the subscriber's own check
                    socket.recv_multipart(zmq.NOBLOCK)
                    count()

            fd = socket.getsockopt(zmq.FD)
            assert isinstance(fd, int)
            loop.add_reader(fd, drain)
    else:
        endpoints = [
            Endpoint(EndpointMetadata(f"127.0.0.1:{10_000 + i}", "p", kv_events_port=port))
            for i, port in enumerate(ports)
        ]
        subscriber = KVEventSubscriber(PreciseIndex(hooks=KVEventHooks(lag=count)), endpoints)
        await subscriber.start()
    await asyncio.wait_for(first.wait(), 30)
    at_first, before = received, resource.getrusage(resource.RUSAGE_SELF)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(last.wait(), 120)
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if subscriber is not None:
        await subscriber.stop()
    read = received - at_first
    return {"batches": read, "cpu_us_per_batch": cpu / max(read, 1) * 1e6}


def measure(mode: str, args: argparse.Namespace) -> dict[str, float]:
    """One fresh subscriber process in ``mode`` against one fresh publisher process."""
    ports = json.dumps([free_port() for _ in range(PUBLISHERS)])
    common = ["--batches", str(args.batches), "--rate", str(args.rate)]
    common += ["--run-blocks", str(args.run_blocks)]
    module = [sys.executable, "-m", "bench.kv_events"]
    with subprocess.Popen(
        [*module, "--subscribe", mode, "--ports", ports, *common],
        stdout=subprocess.PIPE,
        text=True,
    ) as reader:
        subprocess.run([*module, "--publish", "--ports", ports, *common], check=True)
        out, _ = reader.communicate(timeout=60)
    if reader.returncode != 0:
        raise RuntimeError(f"the {mode} subscriber failed")
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=4_000)
    parser.add_argument("--rate", type=float, default=400.0, help="batches per second, in all")
    parser.add_argument("--run-blocks", type=int, default=20, help="blocks a prefill stores")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ports", help=argparse.SUPPRESS)
    parser.add_argument("--publish", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--subscribe", choices=("floor", "kvgate"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.publish:
        publish(json.loads(args.ports), args.batches, args.rate, args.run_blocks)
        return 0
    if args.subscribe:
        ports = json.loads(args.ports)
        print(json.dumps(uvloop.run(subscribe(args.subscribe, ports, args.batches))))
        return 0
    floors, ours, ratios = [], [], []
    for round_ in range(args.rounds):
        order = ("floor", "kvgate") if round_ % 2 == 0 else ("kvgate", "floor")
        results = {mode: measure(mode, args) for mode in order}
        floor, kvgate = (results[m]["cpu_us_per_batch"] for m in ("floor", "kvgate"))
        floors.append(floor)
        ours.append(kvgate)
        ratios.append(kvgate / floor)
        print(f"round {round_}: floor {floor:.0f} µs, kvgate {kvgate:.0f} µs", flush=True)
    print(
        f"\n## KV events: subscriber CPU per batch ({args.batches:,} batches at "
        f"{args.rate:.0f}/s over {PUBLISHERS} publishers; medians of {args.rounds} rounds)\n"
    )
    print("| reader | CPU µs per batch | ÷ floor |")
    print("|---|---:|---:|")
    print(f"| ZMQ floor (receive only) | {statistics.median(floors):.0f} | 1.00 |")
    print(
        f"| kvgate KVEventSubscriber + PreciseIndex | {statistics.median(ours):.0f} "
        f"| {statistics.median(ratios):.2f} |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
