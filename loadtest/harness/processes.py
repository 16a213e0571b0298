"""Start kvgate processes on loopback and wait until they serve (demo, benchmarks, tests)."""

from __future__ import annotations

import ctypes
import os
import random
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

_HANDED_OUT: set[int] = set()
_PORTS = random.SystemRandom()  # not the global generator, which tests seed
PR_SET_PDEATHSIG = 1


def _end_with_parent() -> None:
    """In a child before exec (Linux): SIGTERM when the thread that started it exits."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def ephemeral_ports() -> tuple[int, int]:
    """The range the kernel picks ports from for ``bind(0)`` and outgoing connections."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def outside_ephemeral_range(low: int, high: int) -> tuple[int, int]:
    """Where ``free_port`` draws from (``[first, last)``): below the kernel's ephemeral range
    ``low``..``high`` when there are at least 512 unprivileged ports there, else above it, else
    (a range that covers every unprivileged port) anywhere unprivileged."""
    low = min(low, 32768)
    if low - 1024 >= 512:
        return max(low // 2, 1024), low
    if 65535 - high >= 512:
        return high + 1, 65536
    return 1024, 65536


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, that this process has not
    handed out before, and that lies below the kernel's ephemeral range: a port the kernel
    hands out itself can be taken, between this call and the server's bind, by any socket
    that binds port 0 or connects (a vLLM server's own ZMQ sockets took its KV-events port
    that way), and it may give the same free port to two calls in a row. A kernel whose
    ephemeral range starts at 1,024 or lower leaves no room below it: then a port above it."""
    first, last = outside_ephemeral_range(*ephemeral_ports())
    for _ in range(200):
        port = _PORTS.randrange(first, last)
        if port in _HANDED_OUT:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError("no fresh free port after 200 tries")


def wait_http_ok(
    url: str,
    timeout: float = 20.0,
    proc: subprocess.Popen[bytes] | None = None,
    tls: ssl.SSLContext | None = None,
) -> None:
    """Poll ``url`` until it answers 200; raise if ``proc`` exits or time runs out; ``tls``:
    how an ``https://`` URL's server is verified."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} was ready")
        try:
            with urllib.request.urlopen(url, timeout=1.0, context=tls) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url} not ready after {timeout}s")


@contextmanager
def external_process(
    argv: list[str],
    health: str | None,
    env: dict[str, str] | None = None,
    log: Path | None = None,
    tls: ssl.SSLContext | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """Another program (a peer) as a child process, ready once ``health`` answers 200
    (``tls``: how an https:// health URL is verified; None: at once); terminated on exit. Its
    output goes to ``log`` (default: nowhere)."""
    out = open(log, "ab") if log is not None else subprocess.DEVNULL  # noqa: SIM115
    proc = subprocess.Popen(
        argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
    )
    try:
        if health is not None:
            wait_http_ok(health, 30, proc, tls)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        if log is not None and not isinstance(out, int):
            out.close()


class KvgateProcess:
    """``python -m kvgate ARGS`` as a child process, stopped with SIGTERM on exit.

    ``tree``: the source tree to run from (its packages come first on the import path), e.g.
    the compiled copy ``make compiled`` builds; by default the current directory's."""

    def __init__(
        self,
        args: Sequence[str],
        health_url: str,
        *,
        quiet: bool = True,
        log: str | None = None,
        tree: str | None = None,
        health_tls: ssl.SSLContext | None = None,
    ) -> None:
        self.args = list(args)
        self.tree = tree
        self.health_url = health_url
        self.health_tls = health_tls  # verifies an https:// health URL
        self.quiet = quiet
        self.log = log  # a file for the process's stdout and stderr
        self.proc: subprocess.Popen[bytes] | None = None
        # Linux: the child gets SIGTERM if this process dies without stopping it (kill -9);
        # only for children started from a thread that outlives them (the main thread).
        self.end_with_parent = False

    def start(self, timeout: float = 20.0) -> KvgateProcess:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        argv = [sys.executable, "-m", "kvgate", *self.args]
        preexec = _end_with_parent if self.end_with_parent and sys.platform == "linux" else None
        if self.log is not None:
            with open(self.log, "ab") as log:
                self.proc = subprocess.Popen(
                    argv,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=self.tree,
                    preexec_fn=preexec,
                )
        else:
            out = subprocess.DEVNULL if self.quiet else None
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=out, env=env, cwd=self.tree, preexec_fn=preexec
            )
        try:
            wait_http_ok(self.health_url, timeout, self.proc, self.health_tls)
        except (RuntimeError, TimeoutError) as exc:
            self.stop()
            raise RuntimeError(
                f"kvgate {' '.join(self.args[:1])}: {exc}{self._log_tail()}"
            ) from None
        except BaseException:
            self.stop()
            raise
        return self

    def _log_tail(self, lines: int = 15) -> str:
        """The end of the child's log, to show why it did not start (empty without a log)."""
        if self.log is None:
            return ""
        try:
            text = Path(self.log).read_text(errors="replace").rstrip()
        except OSError:
            return ""
        tail = "\n".join("    " + line for line in text.splitlines()[-lines:])
        return f"\n  its output ({self.log}):\n{tail}" if tail else ""

    def kill(self) -> None:
        """Hard kill (SIGKILL), as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def __enter__(self) -> KvgateProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def backend_process(
    port: int,
    *extra: str,
    model: str = "kvgate-sim",
    quiet: bool = True,
    runner: str = "sim",
    log: str | None = None,
) -> KvgateProcess:
    """A reference backend (simulated unless ``runner``) on 127.0.0.1:``port``, not started."""
    args = [
        "backend",
        "--runner",
        runner,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--model",
        model,
        *extra,
    ]
    return KvgateProcess(args, f"http://127.0.0.1:{port}/health", quiet=quiet, log=log)


def gateway_process(
    policy_file: str,
    port: int,
    *extra: str,
    quiet: bool = True,
    log: str | None = None,
    tree: str | None = None,
) -> KvgateProcess:
    """A gateway on 127.0.0.1:``port`` serving ``policy_file`` (not started yet)."""
    args = ["gateway", "--policy", policy_file, "--host", "127.0.0.1", "--port", str(port), *extra]
    health = f"http://127.0.0.1:{port}/healthz"
    return KvgateProcess(args, health, quiet=quiet, log=log, tree=tree)


def epp_process(policy_file: str, grpc_port: int, metrics_port: int) -> KvgateProcess:
    """``kvgate epp`` on 127.0.0.1 serving ``policy_file`` (not started yet)."""
    args = [
        "epp",
        "--policy",
        policy_file,
        "--host",
        "127.0.0.1",
        "--grpc-port",
        str(grpc_port),
        "--metrics-port",
        str(metrics_port),
    ]
    return KvgateProcess(args, f"http://127.0.0.1:{metrics_port}/metrics")
