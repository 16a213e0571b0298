"""The vLLM tier: real vLLM servers (CPU build, tiny local model), started once per session.

Runs under ``make test-vllm``, which builds the venv and the model and passes their paths; in
any other run every test here is skipped, saying why.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from loadtest.harness.vllm import VllmServer


def _unavailable() -> str | None:
    python, model = os.environ.get("KVGATE_VLLM_PYTHON"), os.environ.get("KVGATE_TINY_MODEL")
    marker = os.environ.get("KVGATE_VLLM_UNAVAILABLE")
    if marker and Path(marker).is_file() and Path(marker).read_text().strip():
        return f"vLLM tier skipped: {Path(marker).read_text().strip()}"
    if not python or not model:
        return "vLLM tier: run `make test-vllm` (it builds vLLM's venv and a tiny model)"
    if not Path(python).is_file() or not Path(model, "config.json").is_file():
        return f"vLLM tier skipped: {python} or {model} is missing"
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    reason = _unavailable()
    if reason is None:
        return
    for item in items:
        if Path(str(item.fspath)).parent == Path(__file__).parent:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def tiny_model() -> str:
    return os.environ["KVGATE_TINY_MODEL"]


@pytest.fixture(scope="session")
def vllm_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[VllmServer]]:
    """Two vLLM servers of the tiny model, one per core, with KV events and replay on."""
    logs = tmp_path_factory.mktemp("vllm")
    python, model = os.environ["KVGATE_VLLM_PYTHON"], os.environ["KVGATE_TINY_MODEL"]
    servers = [VllmServer(python, model, log=logs / f"vllm-{i}.log", cpu=str(i)) for i in range(2)]
    try:
        for server in servers:
            server.start()
        with ThreadPoolExecutor(len(servers)) as pool:
            list(pool.map(lambda s: s.wait_ready(), servers))
        yield servers
    finally:
        for server in servers:
            server.stop()
