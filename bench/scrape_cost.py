"""CPU per metrics scrape, whole against filtered (``/metrics?name[]=...``, the picker's own
scrape): a real reference backend serving its vLLM-named metrics, scraped over the picker's
keep-alive client on uvloop; the scraper's CPU (this process) and the server's (its process,
from /proc) per scrape. Run by `make bench-epp`.

The two paths alternate in rounds and the median of each is reported (the machine is shared).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import uvloop

from epp.datalayer.metrics_parser import VLLM, parse_metrics
from epp.datalayer.scraper import WHOLE, fetch_metrics, filtered_path
from kvgate.wire.http.connection_pool import ConnectionPool
from loadtest.harness.proc_stats import cpu_seconds
from loadtest.harness.processes import backend_process, free_port

SCRAPES = 500  # per path and round


@dataclass(frozen=True)
class ScrapeCost:
    path: str
    body_bytes: int
    scraper_us: float  # the picker's CPU per scrape: request, read and parse
    server_us: float  # the backend's CPU per scrape


async def _rounds(address: str, pid: int, rounds: int) -> list[ScrapeCost]:
    pool = ConnectionPool(connect_timeout=5.0)
    paths = (WHOLE, filtered_path(VLLM))
    samples: dict[str, list[tuple[float, float]]] = {path: [] for path in paths}
    sizes = {path: len(await fetch_metrics(pool, address, path, 5.0)) for path in paths}
    try:
        for turn in range(rounds):
            for path in paths if turn % 2 == 0 else paths[::-1]:
                ours, theirs = time.process_time(), cpu_seconds(pid)
                for _ in range(SCRAPES):
                    parse_metrics(await fetch_metrics(pool, address, path, 5.0), VLLM)
                scraper = (time.process_time() - ours) / SCRAPES * 1e6
                samples[path].append((scraper, (cpu_seconds(pid) - theirs) / SCRAPES * 1e6))
    finally:
        pool.close()
    return [
        ScrapeCost(
            path,
            sizes[path],
            statistics.median(s for s, _ in samples[path]),
            statistics.median(t for _, t in samples[path]),
        )
        for path in paths
    ]


def compare(rounds: int = 6) -> list[ScrapeCost]:
    """Whole and filtered scrapes of a simulated backend serving two LoRA adapters."""
    port = free_port()
    adapters = ("--max-loras", "2", "--lora-modules", "a=/nonexistent/a", "b=/nonexistent/b")
    with backend_process(port, *adapters) as backend:
        assert backend.proc is not None
        return uvloop.run(_rounds(f"127.0.0.1:{port}", backend.proc.pid, rounds))


def main() -> None:
    print("| scrape | body bytes | scraper CPU µs | server CPU µs |")
    print("|---|---:|---:|---:|")
    for cost in compare():
        name = "whole" if cost.path == WHOLE else "filtered"
        print(f"| {name} | {cost.body_bytes:,} | {cost.scraper_us:.0f} | {cost.server_us:.0f} |")


if __name__ == "__main__":
    main()
