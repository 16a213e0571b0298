"""The vLLM harness says which server did not come up, how long it was given, and the end of its
log: never only a timeout (faked vLLMs: a Python without vLLM, a process that never serves)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from loadtest.harness.vllm import VllmServer, VllmStartError, wait_all_ready


def test_a_server_that_exits_is_named_with_its_log(tmp_path: Path) -> None:
    server = VllmServer(sys.executable, str(tmp_path), log=tmp_path / "vllm.log", cpu="1")
    server.start()
    try:
        with pytest.raises(VllmStartError) as err:
            wait_all_ready([server], timeout=60)
    finally:
        server.stop()
    message = str(err.value)
    assert f"vLLM tiny-llama on {server.address} (cpu 1) exited with 1" in message
    assert "No module named" in message and str(tmp_path / "vllm.log") in message


def test_servers_not_ready_in_time_are_each_named(tmp_path: Path) -> None:
    never = tmp_path / "never-serves"
    never.write_text("#!/bin/sh\necho loading the model\nexec sleep 60\n")
    never.chmod(0o755)
    servers = [VllmServer(str(never), str(tmp_path), log=tmp_path / f"{n}.log") for n in range(2)]
    for server in servers:
        server.start()
    try:
        with pytest.raises(VllmStartError) as err:
            wait_all_ready(servers, timeout=2)
    finally:
        for server in servers:
            server.stop()
    message = str(err.value)
    for server in servers:
        assert f"on {server.address} was not ready after 2s" in message
    assert message.count("loading the model") == 2
