"""Per-stage reports of a load ramp, in the shape of inference-perf's lifecycle reports: for
each stage, what was asked and achieved (``load_summary``), the successes' latencies and
throughput, and the failures by kind."""

from __future__ import annotations

from dataclasses import dataclass

from loadtest.reports.records import RequestRecord
from loadtest.reports.serving_metrics import errors_by_kind, metric_values
from loadtest.reports.stats import summarize

LATENCIES = {
    "request_latency": "e2el",
    "time_to_first_token": "ttft",
    "time_per_output_token": "tpot",
    "inter_token_latency": "itl",
}


@dataclass(frozen=True)
class Stage:
    """One step of the load: ``rate`` requests/s (open loop) or ``concurrency`` requests in
    flight (closed loop), for ``duration`` seconds (0: until the requests run out)."""

    rate: float = 0.0
    concurrency: int = 0
    duration: float = 0.0

    @property
    def label(self) -> str:
        if self.concurrency:
            return f"concurrency {self.concurrency}"
        return f"{self.rate:g} req/s" if self.rate else "as fast as possible"


def stage_report(
    records: list[RequestRecord], stages: list[Stage], seconds: list[float]
) -> list[dict[str, object]]:
    """One report per stage; ``seconds`` is how long each stage actually ran."""
    reports: list[dict[str, object]] = []
    for index, stage in enumerate(stages):
        mine = [r for r in records if r.stage == index]
        ok = [r for r in mine if r.ok]
        took = seconds[index] if index < len(seconds) else 0.0
        per_s = 1 / took if took > 0 else 0.0
        sent = [r.start for r in mine]
        send_duration = max(sent) - min(sent) if len(sent) > 1 else 0.0
        input_tokens = sum(r.prompt_tokens for r in ok)
        output_tokens = sum(r.output_tokens for r in ok)
        reports.append(
            {
                "stage": index,
                "label": stage.label,
                "load_summary": {
                    "count": len(mine),
                    "send_duration": send_duration,
                    "requested_rate": stage.rate or None,
                    "concurrency": stage.concurrency or None,
                    "achieved_rate": (len(mine) - 1) / send_duration if send_duration else 0.0,
                },
                "successes": {
                    "count": len(ok),
                    "latency": {
                        name: summarize(metric_values(ok, metric)).as_dict()
                        for name, metric in LATENCIES.items()
                    },
                    "throughput": {
                        "input_tokens_per_sec": input_tokens * per_s,
                        "output_tokens_per_sec": output_tokens * per_s,
                        "total_tokens_per_sec": (input_tokens + output_tokens) * per_s,
                        "requests_per_sec": len(ok) * per_s,
                    },
                    "cached_tokens": sum(r.cached_tokens for r in ok),
                },
                "failures": {"count": len(mine) - len(ok), "by_kind": errors_by_kind(mine)},
            }
        )
    return reports
