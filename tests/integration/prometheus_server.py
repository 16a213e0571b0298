"""A real Prometheus on loopback for the tests (installed by `make test`: Debian's package)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml


class PrometheusServer:
    def __init__(self, directory: Path, port: int) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise RuntimeError("prometheus is not installed (make test installs it with apt)")
        self.binary = binary
        self.directory = directory
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, config: dict[str, Any]) -> PrometheusServer:
        path = self.directory / "prometheus.yml"
        path.write_text(yaml.safe_dump(config))
        with open(self.directory / "prometheus.log", "wb") as log:  # the child keeps its copy
            self.proc = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={path}",
                    f"--storage.tsdb.path={self.directory / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.directory / "prometheus.log").read_text()[-2000:]
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as response:
                    if response.status == 200:
                        return self
            except OSError:
                time.sleep(0.2)
        raise TimeoutError("prometheus did not become ready")

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        result = data["result"]
        assert isinstance(result, list)
        return result

    def firing(self) -> dict[str, list[dict[str, str]]]:
        """The firing alerts' labels, by alert name."""
        out: dict[str, list[dict[str, str]]] = {}
        for alert in self.api("alerts")["alerts"]:
            if alert["state"] == "firing":
                out.setdefault(alert["labels"]["alertname"], []).append(alert["labels"])
        return out

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
