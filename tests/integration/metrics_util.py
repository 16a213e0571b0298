"""Read a backend's /metrics with Prometheus' own text parser."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


def scrape(base_url: str, query: str = "") -> dict[str, list[Sample]]:
    """Samples by wire name; ``query``: e.g. ``?name[]=...`` (URL-encoded)."""
    with urllib.request.urlopen(f"{base_url}/metrics{query}", timeout=5) as response:
        text = response.read().decode()
    samples: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def value(base_url: str, name: str) -> float:
    """The value of a single-series metric, by its wire name (counters end in ``_total``)."""
    return scrape(base_url)[name][0].value
