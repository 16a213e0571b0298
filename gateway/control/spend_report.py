"""``kvgate spend report --prometheus URL --month 2026-11``: what each tenant spent on each
model in a calendar month (UTC), from the gateways' ``kvgate_spend_total`` in Prometheus.

The increase of every series over the month is added up from its raw samples, exactly: from
its value just before the month began (none: the series began in the month, from 0), counting
a drop as a restart of the gateway that reported it (the counter began again at 0). Prometheus'
own ``increase()`` extrapolates to the range's edges, which a bill should not.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import urllib.parse
import urllib.request
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

METRIC = "kvgate_spend_total"
GROUP = ("tenant", "model")


def month_bounds(month: str, now: datetime) -> tuple[datetime, datetime]:
    """The month's first instant and its end (now, for the current month)."""
    start = datetime.strptime(month, "%Y-%m").replace(tzinfo=UTC)
    following = (start + timedelta(days=32)).replace(day=1)
    return start, min(following, now)


def series_increase(base: float | None, values: Iterable[float]) -> float:
    """How much a counter rose over its samples, starting from ``base`` (None: from 0)."""
    total, previous = 0.0, base or 0.0
    for value in values:
        total += value - previous if value >= previous else value  # a drop: a restart
        previous = value
    return total


def spend_by_group(url: str, start: datetime, end: datetime) -> dict[tuple[str, ...], float]:
    """Spend per (tenant, model) from ``start`` to ``end``, from the Prometheus at ``url``."""
    seconds = max(1, int((end - start).total_seconds()))
    before = _query(url, METRIC, start)
    bases = {_identity(item["metric"]): float(item["value"][1]) for item in before}
    totals: dict[tuple[str, ...], float] = defaultdict(float)
    for item in _query(url, f"{METRIC}[{seconds}s]", end):
        labels = item["metric"]
        values = (float(value) for _, value in item["values"])
        group = tuple(labels.get(name, "") for name in GROUP)
        totals[group] += series_increase(bases.get(_identity(labels)), values)
    return dict(totals)


def _identity(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k != "__name__"))


def _query(url: str, query: str, at: datetime) -> list[dict[str, Any]]:
    params = urllib.parse.urlencode({"query": query, "time": f"{at.timestamp():.3f}"})
    with urllib.request.urlopen(f"{url.rstrip('/')}/api/v1/query?{params}", timeout=30) as reply:
        body = json.loads(reply.read())
    if body.get("status") != "success":
        raise RuntimeError(f"Prometheus refused {query!r}: {body.get('error', body)}")
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def _print(totals: dict[tuple[str, ...], float], as_csv: bool, currency: str) -> None:
    rows = sorted(totals.items())
    if as_csv:
        writer = csv.writer(sys.stdout)
        writer.writerow([*GROUP, f"spend_{currency.lower()}"])
        writer.writerows([*group, f"{amount:.6f}"] for group, amount in rows)
        return
    print(f"| tenant | model | spend ({currency}) |")
    print("|---|---|---:|")
    for (tenant, model), amount in rows:
        print(f"| {tenant or '(anonymous)'} | {model} | {amount:,.6f} |")
    print(f"| total | | {sum(totals.values()):,.6f} |")


def _run(args: argparse.Namespace) -> int:
    try:
        start, end = month_bounds(args.month, datetime.now(UTC))
    except ValueError:
        print(f"--month must be YYYY-MM; got {args.month!r}", file=sys.stderr)
        return 2
    if end <= start:
        print(f"{args.month} has not begun", file=sys.stderr)
        return 2
    try:
        totals = spend_by_group(args.prometheus, start, end)
    except (OSError, RuntimeError, ValueError) as exc:
        print(f"cannot read spend from {args.prometheus}: {exc}", file=sys.stderr)
        return 1
    _print(totals, args.csv, args.currency)
    return 0


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    spend = subparsers.add_parser("spend", help="what tenants spent, from Prometheus")
    commands = spend.add_subparsers(dest="spend_command", metavar="COMMAND", required=True)
    report = commands.add_parser("report", help="spend by tenant and model in one month")
    report.add_argument("--prometheus", required=True, help="Prometheus' URL")
    report.add_argument("--month", required=True, help="the calendar month (UTC), YYYY-MM")
    report.add_argument("--csv", action="store_true", help="CSV instead of a table")
    report.add_argument("--currency", default="USD", help="the policy's spend.currency")
    report.set_defaults(func=_run)
