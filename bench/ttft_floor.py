"""The TTFT no router can beat on a simulated workload: each request alone on an idle engine
that already holds every prompt token an ideal router could have had cached for it (the reuse
oracle's count), costed by the simulated runner's default model. The routing benchmark reports
its p90 beside the routers', so a goal below it shows as such."""

from __future__ import annotations

from backends.runners.sim_runner import CostModel
from loadtest.reports.stats import percentile


def idle_ttft_ms(
    prompts: list[list[int]], cached: list[int], cost: CostModel | None = None
) -> list[float]:
    """Per prompt, in order: one prefill step of its tokens but the ``cached`` ones (the reuse
    oracle's count, ``cacheable_per_prompt``; all of it read by attention) on an idle engine,
    in milliseconds."""
    cost = cost or CostModel()
    return [
        1000
        * (cost.step_s + cost.prefill_token_s * (len(ids) - hit) + cost.kv_read_token_s * len(ids))
        for ids, hit in zip(prompts, cached, strict=True)
    ]


def idle_ttft_p90_ms(prompts: list[list[int]], cached: list[int]) -> float:
    """The p90 of ``idle_ttft_ms`` over ``prompts``."""
    return percentile(idle_ttft_ms(prompts, cached), 90)
