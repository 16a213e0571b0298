"""The picker at fleet scale, in process: ``python -m bench.picker_scale``.

One ``EppService`` (the default profile, approximate prefix mode; ``--precise``: the shipped
precise profile, its index fed KV-event batches) over 100, 1,000 and 5,000 endpoints whose
indexes hold 1M and 10M blocks: chains of 64 blocks spread over the endpoints, each endpoint's
capacity room for its share, its metrics scraped (a spread of running requests and KV usage).
Then ``--picks`` picks of 1,000-token chat prompts of 50 shared system prompts (warm on some
endpoints), each taken by its endpoint as the embedded picker's are (``EppService.pick`` then
``dispatched``): pick p50/p99 and picks/s, and the process's resident memory over the empty
service's per million indexed blocks (the index's cost, read from ``/proc``).
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time

from bench.epp import timed_picks
from bench.fleet_sim import policy_text as fleet_policy
from bench.routing_peers import precise_profile
from epp.datalayer.indexes.approximate import ApproximatePrefixCache
from epp.datalayer.indexes.precise_cache import PrecisePrefixCache
from epp.service import EppService
from kvgate.wire.kv_events import BlockStored, encode_event
from loadtest.reports.stats import percentile
from policies.loader import load_policy_text

CHAIN = 64  # blocks per filler chain


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def policy_text(endpoints: int, precise: bool) -> str:
    return fleet_policy(endpoints, precise, precise_profile() if precise else "", "m")


def scraped(service: EppService, blocks_each: int, seed: int) -> None:
    """Every endpoint scraped, fresh for the run, with room for ``blocks_each`` blocks."""
    rng = random.Random(seed)
    now = time.monotonic()
    for endpoint in service.datastore.all():
        m = endpoint.metrics
        m.scraped_at, m.block_size, m.num_gpu_blocks = now + 3600, 16, max(4096, 2 * blocks_each)
        m.running, m.waiting, m.kv_usage = rng.randrange(8), 0, rng.uniform(0.1, 0.6)


def fill(service: EppService, blocks: int, seed: int) -> None:
    """``blocks`` blocks in chains of ``CHAIN``, each on one endpoint, spread evenly."""
    rng = random.Random(seed)
    endpoints = service.datastore.all()
    for index in service.handle.indexes.values():
        for number in range(blocks // CHAIN):
            endpoint = endpoints[number % len(endpoints)]
            chain = [rng.getrandbits(63) for _ in range(CHAIN)]
            if isinstance(index, ApproximatePrefixCache):
                index.index.record(endpoint.address, chain, 1 << 30)
            elif isinstance(index, PrecisePrefixCache):  # a chain of its own from its first token
                tokens = [number, *bytes(16 * CHAIN - 1)]
                event = encode_event(BlockStored(chain, None, tokens, 16, None))
                seq = index.index.last_seq(endpoint.address) + 1
                index.index.apply_batch(endpoint.address, seq, [event])


def measure(endpoints: int, blocks: int, picks: int, precise: bool) -> dict[str, float]:
    gc.collect()
    service = EppService(load_policy_text(policy_text(endpoints, precise)))
    scraped(service, blocks // endpoints, endpoints)
    empty = rss_mib()
    started = time.perf_counter()
    fill(service, blocks, endpoints)
    filled = time.perf_counter() - started
    gc.collect()
    held = rss_mib()
    times = [t * 1e6 for t in timed_picks(service, 1_000, picks)]
    del service
    return {
        "p50_us": percentile(times, 50),
        "p99_us": percentile(times, 99),
        "picks_per_s": 1e6 / statistics.fmean(times),
        "mib_per_million": (held - empty) / (blocks / 1e6),
        "fill_s": filled,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--endpoints", type=int, action="append", help="100 1000 5000")
    parser.add_argument("--blocks", type=float, action="append", help="millions: 1 10")
    parser.add_argument("--picks", type=int, default=2000)
    parser.add_argument("--precise", action="store_true")
    args = parser.parse_args()
    mode = "precise (KV events)" if args.precise else "approximate"
    print(f"## The picker at scale ({mode}, default profile; 1,000-token chat prompts)\n")
    print(
        "| endpoints | indexed blocks | pick p50 µs | pick p99 µs | picks/s "
        "| index MiB per 1M blocks | fill s |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for endpoints in args.endpoints or [100, 1_000, 5_000]:
        for millions in args.blocks or [1.0, 10.0]:
            r = measure(endpoints, int(millions * 1e6), args.picks, args.precise)
            print(
                f"| {endpoints:,} | {millions:g}M | {r['p50_us']:.0f} | {r['p99_us']:.0f} "
                f"| {r['picks_per_s']:,.0f} | {r['mib_per_million']:.0f} "
                f"| {r['fill_s']:.0f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
