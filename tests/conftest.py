"""Shared fixtures: real ``kvgate backend`` and gateway subprocesses, and a real redis-server, on
loopback."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from loadtest.harness.processes import KvgateProcess, backend_process, free_port, gateway_process
from loadtest.harness.redis_server import RedisServer
from tests.fakes import CLOSE_AFTER_TEST


@pytest.fixture
def start_backend() -> Iterator[Callable[..., str]]:
    """Start a simulated backend with extra CLI args; returns its base URL."""
    started: list[KvgateProcess] = []

    def start(*extra: str, model: str = "kvgate-sim") -> str:
        port = free_port()
        proc = backend_process(port, *extra, model=model).start()
        started.append(proc)
        return f"http://127.0.0.1:{port}"

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture(scope="module")
def backend_url() -> Iterator[str]:
    """One shared simulated backend (default cost model) for read-mostly tests."""
    port = free_port()
    with backend_process(port, "--num-blocks", "512", "--max-loras", "2"):
        yield f"http://127.0.0.1:{port}"


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A real redis-server on a free loopback port, stopped after the test."""
    server = RedisServer(free_port()).start()
    yield server
    server.stop()


@pytest.fixture
def start_gateway(tmp_path: Path) -> Iterator[Callable[..., tuple[str, KvgateProcess]]]:
    """Start a gateway on a policy text; returns (base URL, process)."""
    started: list[KvgateProcess] = []

    def start(policy: str, *extra: str) -> tuple[str, KvgateProcess]:
        path = tmp_path / f"policy-{len(started)}.yaml"
        path.write_text(policy)
        port = free_port()
        log = str(tmp_path / f"gateway-{len(started)}.log")
        proc = gateway_process(str(path), port, *extra, log=log).start()
        started.append(proc)
        return f"http://127.0.0.1:{port}", proc

    yield start
    for proc in started:
        proc.stop()


def pytest_collection_finish(session: pytest.Session) -> None:
    """What the imports made lives for the whole run: out of every collection (so that the
    one after each test costs microseconds, not a tenth of a second)."""
    gc.freeze()


@pytest.fixture(autouse=True)
def _close_after() -> Iterator[None]:
    """Closes what the test's helpers handed to ``tests.fakes.close_after_test``, then collects
    what the test left unreachable: a socket or file it did not close warns (an error) in the
    test that made it, not in whichever later test the collector happens to run."""
    yield
    while CLOSE_AFTER_TEST:
        CLOSE_AFTER_TEST.pop()()
    gc.collect()
