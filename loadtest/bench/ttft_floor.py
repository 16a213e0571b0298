"""The TTFT no router can beat on a simulated workload: each request alone on an idle engine
that already holds every prompt token an ideal router could have had cached for it (the reuse
oracle's count), costed by the simulated runner's default model. The routing benchmark reports
its p90 beside the routers', so a goal below it shows as such."""

from __future__ import annotations

import statistics

from backends.runners.sim_runner import CostModel
from loadtest.reports.records import RequestRecord
from loadtest.run.session import BLOCK
from loadtest.workloads.reuse_oracle import cacheable_per_prompt


def idle_ttft_ms(prompts: list[list[int]], cost: CostModel | None = None) -> list[float]:
    """Per prompt, in order: one prefill step of its uncached tokens (all of it read by
    attention) on an idle engine, in milliseconds."""
    cost = cost or CostModel()
    cached = cacheable_per_prompt(prompts, BLOCK)
    return [
        1000
        * (cost.step_s + cost.prefill_token_s * (len(ids) - hit) + cost.kv_read_token_s * len(ids))
        for ids, hit in zip(prompts, cached, strict=True)
    ]


def idle_ttft_p90_ms(tokens: list[list[int]], records: list[RequestRecord]) -> float:
    """The p90 of ``idle_ttft_ms`` over the requests that were sent, in the order sent."""
    sent = sorted((r for r in records if r.index >= 0), key=lambda r: r.start)
    floors = idle_ttft_ms([tokens[r.index] for r in sent])
    return statistics.quantiles(floors, n=10, method="inclusive")[-1] if len(floors) > 1 else 0.0
