"""The vLLM tier: real vLLM servers (CPU build, tiny local model), started once per session.

Runs under ``make test-vllm``, which builds the venv and the model and passes their paths; in
any other run every test here is skipped, saying why.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadtest.harness.vllm import STARTUP_TIMEOUT, VllmServer, wait_all_ready

TEST_TIMEOUT = 120  # seconds, pyproject's pytest timeout


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
    """Skip the tier (saying why) where it cannot run; where it can, each test may take the
    servers' start-up on top of its own time (the first test pays for the session's servers,
    and one test restarts a server)."""
    reason = _unavailable()
    for item in items:
        if Path(str(item.fspath)).parent != Path(__file__).parent:
            continue
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))
        else:
            item.add_marker(pytest.mark.timeout(STARTUP_TIMEOUT + TEST_TIMEOUT))


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
        # both at once, each pinned to a core of its own: on two cores, one after the other
        # takes the sum of two start-ups where together they take about one
        for server in servers:
            server.start()
        wait_all_ready(servers)
        yield servers
    finally:
        for server in servers:
            server.stop()
