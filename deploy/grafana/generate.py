"""kvgate's Grafana dashboards, built with Grafana's own SDK (grafana-foundation-sdk) and
written to ``dashboards/*.json``: ``python deploy/grafana/generate.py`` (``--check`` fails when
the committed JSON differs from what this file builds; tests/deploy runs it).

Every panel is a time series of one PromQL query, over the metrics of kvgate's gateways
(job ``kvgate``), the model servers (job ``model-servers``, labelled with their ``pool``) and
the recording rules of ``deploy/prometheus/kvgate-rules.yml``. The queries are also read by
``tests/integration/control/test_prometheus_stack.py``, which checks that each returns data from a
real Prometheus scraping a gateway under load.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard, prometheus, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef

HERE = Path(__file__).parent / "dashboards"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")


@dataclass(frozen=True)
class Chart:
    title: str
    expr: str
    legend: str
    unit: str = "short"


def quantile_of(metric: str, by: str, q: float = 0.95) -> str:
    return f"histogram_quantile({q}, sum by ({by}, le) (rate({metric}_bucket[5m])))"


DASHBOARDS: dict[str, tuple[str, list[Chart]]] = {
    "kvgate-overview": (
        "kvgate: gateway overview",
        [
            Chart(
                "Requests by model",
                "sum by (model) (rate(kvgate_requests_total[1m]))",
                "{{model}}",
                "reqps",
            ),
            Chart(
                "5xx share by model",
                "kvgate:request_errors:ratio_rate5m",
                "{{model}}",
                "percentunit",
            ),
            Chart("TTFT p95 by model", "kvgate:ttft_seconds:p95_5m", "{{model}}", "s"),
            Chart("TPOT p95 by model", "kvgate:tpot_seconds:p95_5m", "{{model}}", "s"),
            Chart(
                "Request duration p95 by route",
                quantile_of("kvgate_request_duration_seconds", "route"),
                "{{route}}",
                "s",
            ),
            Chart(
                "Tokens by direction",
                "sum by (direction) (rate(kvgate_tokens_total[1m]))",
                "{{direction}}",
                "short",
            ),
            Chart("In flight by pool", "sum by (pool) (kvgate_in_flight_requests)", "{{pool}}"),
            Chart(
                "Queue wait p95 by class",
                quantile_of("kvgate_queue_wait_seconds", "class"),
                "{{class}}",
                "s",
            ),
            Chart(
                "Retries by pool",
                "sum by (pool) (rate(kvgate_retries_total[5m]))",
                "{{pool}}",
                "reqps",
            ),
            Chart(
                "Upstream errors by kind",
                "sum by (kind) (rate(kvgate_upstream_errors_total[5m]))",
                "{{kind}}",
                "reqps",
            ),
            Chart(
                "Breakers (0 closed, 1 half-open, 2 open)",
                "max by (endpoint) (kvgate_breaker_state)",
                "{{endpoint}}",
            ),
            Chart("Rate limiter store", "max by (state) (kvgate_limiter_state)", "{{state}}"),
        ],
    ),
    "kvgate-endpoints": (
        "kvgate: pools and endpoints",
        [
            Chart(
                "KV cache usage",
                "max by (pool, instance) (vllm:kv_cache_usage_perc)",
                "{{pool}} {{instance}}",
                "percentunit",
            ),
            Chart(
                "Prefix cache hit rate",
                "vllm:prefix_cache_hits:ratio_rate5m",
                "{{pool}} {{instance}}",
                "percentunit",
            ),
            Chart(
                "Requests waiting",
                "sum by (pool, instance) (vllm:num_requests_waiting)",
                "{{pool}} {{instance}}",
            ),
            Chart(
                "Requests running",
                "sum by (pool, instance) (vllm:num_requests_running)",
                "{{pool}} {{instance}}",
            ),
            Chart(
                "TTFT p95 (model server)", "vllm:ttft_seconds:p95_5m", "{{pool}} {{instance}}", "s"
            ),
            Chart(
                "Inter-token latency p95 (model server)",
                "vllm:tpot_seconds:p95_5m",
                "{{pool}} {{instance}}",
                "s",
            ),
            Chart("Model servers up", 'up{job="model-servers"}', "{{pool}} {{instance}}"),
            Chart(
                "Picker: pick time p99 by pool",
                quantile_of("kvgate_epp_pick_duration_seconds", "pool", 0.99),
                "{{pool}}",
                "s",
            ),
            Chart(
                "Picker: decisions by scorer",
                "sum by (pool, winner) (rate(kvgate_epp_decisions_total[5m]))",
                "{{pool}} {{winner}}",
                "reqps",
            ),
            Chart(
                "Picker: cold misses (warm endpoint passed over, share of picks)",
                "sum by (pool) (rate(kvgate_epp_warm_diverted_total[5m]))"
                " / sum by (pool) (rate(kvgate_epp_decisions_total[5m]))",
                "{{pool}}",
                "percentunit",
            ),
            Chart(
                "Picker: metric scrapes by endpoint",
                "sum by (endpoint) (rate(kvgate_epp_scrapes_total[5m]))",
                "{{endpoint}}",
                "reqps",
            ),
            Chart(
                "Picker: tokens in flight by endpoint (prefill: not yet computed; decode: owed)",
                "sum by (endpoint, phase) (kvgate_epp_tokens_in_flight)",
                "{{endpoint}} {{phase}}",
            ),
        ],
    ),
    "kvgate-slos": (
        "kvgate: SLOs and error budgets",
        [
            Chart(
                "Budget left (lowest gateway process)",
                "min by (slo, route, class) (kvgate_slo_budget_remaining)",
                "{{route}} {{class}} {{slo}}",
                "percentunit",
            ),
            Chart("Burn rate, 1h", "kvgate:slo_burn_rate:1h", "{{route}} {{class}} {{slo}}"),
            Chart("Burn rate, 5m", "kvgate:slo_burn_rate:5m", "{{route}} {{class}} {{slo}}"),
            Chart(
                "Bad share, 30m",
                "kvgate:slo_errors:ratio_rate30m",
                "{{route}} {{class}} {{slo}}",
                "percentunit",
            ),
            Chart(
                "Events",
                "sum by (slo, route, class, good) (rate(kvgate_slo_events_total[5m]))",
                "{{route}} {{class}} {{slo}} good={{good}}",
                "reqps",
            ),
            Chart(
                "Targets",
                "max by (slo, route, class) (kvgate_slo_target)",
                "{{route}} {{class}} {{slo}}",
                "percentunit",
            ),
        ],
    ),
    "kvgate-canary": (
        "kvgate: canaries",
        [
            Chart(
                "Weight by pool",
                "max by (route, pool) (kvgate_canary_weight)",
                "{{route}} {{pool}}",
                "percent",
            ),
            Chart("Step", "max by (route) (kvgate_canary_step)", "{{route}}"),
            Chart(
                "Status",
                "max by (route, status) (kvgate_canary_status) == 1",
                "{{route}} {{status}}",
            ),
            Chart(
                "Gates (canary / limit; above 1 breached)",
                "max by (route, gate) (kvgate_canary_gate_ratio)",
                "{{route}} {{gate}}",
            ),
            Chart(
                "Decisions, last hour",
                "sum by (route, decision, by) (increase(kvgate_canary_decisions_total[1h]))",
                "{{route}} {{decision}} by {{by}}",
            ),
            Chart(
                "Shadow comparisons",
                "sum by (route, result) (rate(kvgate_shadow_results_total[5m]))",
                "{{route}} {{result}}",
                "reqps",
            ),
        ],
    ),
}


def build(uid: str, title: str, charts: list[Chart]) -> dict[str, object]:
    board = (
        dashboard.Dashboard(title)
        .uid(uid)
        .tags(["kvgate"])
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("browser")
        .with_variable(
            dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus")
        )
    )
    for number, chart in enumerate(charts, start=1):
        query = prometheus.Dataquery().expr(chart.expr).legend_format(chart.legend).ref_id("A")
        board = board.with_panel(
            timeseries.Panel()
            .id(number)
            .title(chart.title)
            .datasource(DATASOURCE)
            .unit(chart.unit)
            .span(12)
            .height(8)
            .with_target(query)
        )
    encoded = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    assert isinstance(encoded, dict)
    return encoded


def rendered() -> dict[str, str]:
    """Each dashboard's file name and JSON text."""
    return {
        f"{uid}.json": json.dumps(build(uid, title, charts), indent=2, sort_keys=True) + "\n"
        for uid, (title, charts) in DASHBOARDS.items()
    }


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for name, text in rendered().items():
        path = HERE / name
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"stale dashboards (run python deploy/grafana/generate.py): {', '.join(stale)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
