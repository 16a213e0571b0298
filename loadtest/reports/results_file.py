"""The load tester's results file: ``vllm bench serve``'s JSON (its setup keys, then its
benchmark keys with the per-request lists of ``--save-detailed``), so plotting scripts written
for vLLM read it, plus kvgate's own under ``"kvgate"``: the workload, the stages and their
reports, errors by kind, captured reuse and the backends' counters.

``records_of`` turns either kind of file (ours or vLLM's own) back into request records, which
is what ``--compare`` plots from.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

from loadtest.reports.records import RequestRecord


def results_document(
    *,
    label: str,
    model: str,
    endpoint: str,
    rate: float | None,
    concurrency: int | None,
    benchmark: dict[str, object],
    extras: dict[str, object],
) -> dict[str, object]:
    endpoint_type = "openai-chat" if endpoint == "chat" else "openai"
    lens = benchmark.get("input_lens")
    return {
        "date": datetime.datetime.now().strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": endpoint_type,
        "backend": endpoint_type,
        "label": label,
        "model_id": model,
        "tokenizer_id": model,
        "num_prompts": len(lens) if isinstance(lens, list) else 0,
        "request_rate": rate if rate is not None else "inf",
        "burstiness": 1.0,
        "max_concurrency": concurrency,
        **benchmark,
        "kvgate": extras,
    }


def write_results(document: dict[str, object], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1, allow_nan=True))


def read_results(path: Path) -> dict[str, object]:
    try:
        document = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a results file ({exc})") from exc
    if not isinstance(document, dict) or "duration" not in document:
        raise ValueError(f"{path}: not a results file (no 'duration' key)")
    return document


def label_of(document: dict[str, object], path: Path) -> str:
    label = document.get("label")
    return str(label) if label else path.stem


def records_of(document: dict[str, object]) -> list[RequestRecord]:
    """The per-request records: ours from ``kvgate.records``, vLLM's rebuilt from its lists
    (``ttfts``, ``latencies``, ``itls``, ``start_times``, ``errors``: present only in files
    saved with ``--save-detailed``)."""
    extras = document.get("kvgate")
    if isinstance(extras, dict) and isinstance(extras.get("records"), list):
        return [RequestRecord.from_dict(r) for r in extras["records"] if isinstance(r, dict)]
    ttfts = document.get("ttfts")
    if not isinstance(ttfts, list):
        return []

    def column(key: str, default: object) -> list[object]:
        values = document.get(key)
        return values if isinstance(values, list) else [default] * len(ttfts)

    starts = column("start_times", 0.0)
    first = min((s for s in starts if isinstance(s, int | float)), default=0.0)
    rows = zip(
        ttfts,
        column("latencies", 0.0),
        column("itls", []),
        starts,
        column("errors", ""),
        column("input_lens", 0),
        column("output_lens", 0),
        strict=False,
    )
    records = []
    for ttft, latency, itls, start, error, prompt, output in rows:
        records.append(
            RequestRecord(
                start=float(start) - first if isinstance(start, int | float) else 0.0,
                error_kind="error" if error else "",
                error=str(error or ""),
                ttft=float(ttft or 0.0),
                latency=float(latency or 0.0),
                itls=[float(v) for v in itls] if isinstance(itls, list) else [],
                prompt_tokens=int(prompt or 0),
                output_tokens=int(output or 0),
            )
        )
    return records
