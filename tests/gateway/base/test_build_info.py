"""The build the tests run against: plain Python (make test) or compiled (make test-compiled)."""

from __future__ import annotations

import importlib
import os
import tomllib
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from gateway.base.build_info import request_path_compiled
from gateway.base.metrics import GatewayMetrics

ROOT = Path(__file__).resolve().parents[3]


def _compiled_modules() -> list[str]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        paths: list[str] = tomllib.load(f)["tool"]["kvgate"]["compiled_modules"]
    return [p.removesuffix(".py").replace("/", ".") for p in paths]


def test_every_listed_module_is_built_the_same_way() -> None:
    """All of the request path is compiled, or none of it: a half-built tree is an error.
    ``make test-compiled`` sets KVGATE_EXPECT_COMPILED=1, so a copy that silently imported
    the Python sources would fail here."""
    expected = os.environ.get("KVGATE_EXPECT_COMPILED") == "1"
    assert request_path_compiled() is expected
    for name in _compiled_modules():
        module = importlib.import_module(name)
        assert module.__file__ is not None
        assert module.__file__.endswith(".py") is not expected, name


def test_build_info_metric_says_how_the_request_path_was_built() -> None:
    text = GatewayMetrics().exposition().decode()
    samples = [
        s
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "kvgate_build_info"
    ]
    assert len(samples) == 1
    assert samples[0].value == 1
    assert samples[0].labels["compiled"] == str(request_path_compiled()).lower()
    assert samples[0].labels["version"] == "0.1.0"
