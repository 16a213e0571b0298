"""Prompts from a JSON-lines file in ``vllm bench serve``'s ``custom`` dataset format: one
``{"prompt": ..., "output_tokens": N}`` object a line (``output_tokens`` optional). kvgate's
load tester and vLLM's read the same file, which is how the two are cross-checked
(``bench.crosscheck``); the order of the file is kept."""

from __future__ import annotations

import json
from pathlib import Path

from loadtest.workloads.chats import Chain, ChatRequest
from loadtest.workloads.sharegpt import DatasetError


def load_custom(path: Path) -> list[Chain]:
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise DatasetError(f"{path}: {exc}") from exc
    chains: list[Chain] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{path}:{number}: {exc}") from exc
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str):
            raise DatasetError(f"{path}:{number}: expected an object with a 'prompt' string")
        output = item.get("output_tokens")
        if output is not None and (not isinstance(output, int) or output < 1):
            raise DatasetError(f"{path}:{number}: 'output_tokens' must be a positive integer")
        message = {"role": "user", "content": item["prompt"]}
        chains.append([ChatRequest([message], group=f"line-{number}", max_tokens=output)])
    return chains


def write_custom(chains: list[Chain], path: Path, output_tokens: int) -> None:
    """Each request as one line: its messages' contents joined (what ``--endpoint
    completions`` sends as the prompt) and its output length."""
    with path.open("w") as out:
        for chain in chains:
            for request in chain:
                prompt = "\n".join(m["content"] for m in request.messages)
                tokens = request.max_tokens or output_tokens
                out.write(json.dumps({"prompt": prompt, "output_tokens": tokens}) + "\n")
