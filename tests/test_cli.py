"""The ``kvgate`` command's shared options (CLI and logs): ``--version``, logging
level and JSON format for every command, defaults in ``--help``, ``keys hash``, and the
warning for an open listener."""

from __future__ import annotations

import hashlib
import json
import logging
import subprocess
import sys

import pytest

from gateway.base.build_info import version
from gateway.cli import warn_if_open
from policies.cli import hash_key
from policies.loader import load_policy_text

KVGATE = [sys.executable, "-m", "kvgate"]


def kvgate(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KVGATE, *args], input=stdin, capture_output=True, text=True, timeout=60)


def test_version() -> None:
    done = kvgate("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"kvgate {version()}"


@pytest.mark.parametrize(
    "args",
    [
        ("--log-format", "json", "backend", "--block-size", "0"),
        ("backend", "--log-format", "json", "--block-size", "0"),
        ("--log-format", "text", "backend", "--log-format", "json", "--block-size", "0"),
    ],
    ids=["before the command", "after it", "after it wins"],
)
def test_json_application_logs(args: tuple[str, ...]) -> None:
    done = kvgate(*args)
    assert done.returncode == 2
    entry = json.loads(done.stderr.strip().splitlines()[-1])
    assert entry["level"] == "error" and entry["logger"] == "kvgate.backend"
    assert "block_size must be positive" in entry["message"]


def test_log_level_filters() -> None:
    done = kvgate("--log-level", "critical", "backend", "--block-size", "0")
    assert done.returncode == 2 and done.stderr == ""


def test_help_shows_defaults() -> None:
    done = kvgate("backend", "--help")
    assert "KV-cache blocks (default: 4096)" in " ".join(done.stdout.split())


def test_keys_hash_ignores_one_trailing_newline() -> None:
    expected = hashlib.sha256(b"sk-live-123").hexdigest()
    for piped in ("sk-live-123", "sk-live-123\n", "sk-live-123\r\n"):
        done = kvgate("keys", "hash", stdin=piped)
        assert done.returncode == 0 and done.stdout.strip() == expected
    done = kvgate("keys", "hash", stdin=" sk-live-123\n")
    assert done.returncode == 1 and "whitespace" in done.stderr
    with pytest.raises(ValueError, match="no key"):
        hash_key("\n")


BASE = "pools: {p: {endpoints: ['127.0.0.1:9']}}\nroutes: [{model: m, pool: p}]\n"


def test_an_open_listener_without_auth_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    key = hashlib.sha256(b"k").hexdigest()
    with caplog.at_level(logging.WARNING, "kvgate.gateway"):
        assert warn_if_open(load_policy_text(BASE + "listen: {host: 0.0.0.0}"))
        assert not warn_if_open(load_policy_text(BASE + "listen: {host: 127.0.0.1}"))
        assert not warn_if_open(
            load_policy_text(
                BASE
                + f"listen: {{host: 0.0.0.0}}\nauth: {{api_keys: [{{sha256: {key}, tenant: t}}]}}"
            )
        )
    assert len(caplog.records) == 1 and "0.0.0.0:8080" in caplog.records[0].getMessage()


def _broken_exporter(endpoint: str, model: str) -> object:
    """What importing the OTLP exporter raised when another wheel overwrote opentelemetry's
    protos with older copies: a name missing from a module that is there."""
    from opentelemetry.proto.common.v1 import common_pb2

    raise ImportError(
        f"cannot import name 'InstrumentationScope' from '{common_pb2.__name__}'",
        name=common_pb2.__name__,
        path=common_pb2.__file__,
    )


def test_a_broken_optional_import_names_its_package_not_torch(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from backends.server.tracing import RequestTracer
    from kvgate.cli import main

    monkeypatch.setattr(RequestTracer, "otlp", staticmethod(_broken_exporter))
    code = main(["backend", "--otlp-traces-endpoint", "http://127.0.0.1:1/v1/traces"])
    said = capsys.readouterr().err
    assert code == 2
    assert "opentelemetry.proto.common.v1.common_pb2" in said
    assert "installed by opentelemetry-proto" in said and "reinstall" in said
    assert "torch" not in said


def test_a_missing_module_is_named() -> None:
    from kvgate.cli import import_failure

    with pytest.raises(ModuleNotFoundError) as missing:
        import kvgate_no_such_module  # type: ignore[import-not-found]  # noqa: F401
    said = import_failure(missing.value)
    assert "kvgate_no_such_module is not installed" in said
