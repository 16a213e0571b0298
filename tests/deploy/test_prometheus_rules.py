"""The Prometheus rules pass ``promtool check rules`` and their unit tests (``promtool test
rules``), every alert has a unit test in which it fires, and the committed dashboards are the
generator's output."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"


def promtool(*args: str) -> str:
    binary = shutil.which("promtool")
    assert binary is not None, "promtool is not installed (make test installs Debian's prometheus)"
    done = subprocess.run(
        [binary, *args], cwd=PROMETHEUS, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_rules_and_the_scrape_config_are_valid() -> None:
    assert "SUCCESS" in promtool("check", "rules", "kvgate-rules.yml")
    assert "SUCCESS" in promtool("check", "config", "prometheus.yml")


def test_the_rules_pass_their_unit_tests() -> None:
    tests = sorted(p.name for p in (PROMETHEUS / "tests").glob("*.yml"))
    assert tests
    output = promtool("test", "rules", *(f"tests/{name}" for name in tests))
    assert output.count("SUCCESS") == len(tests)


def test_every_alert_fires_in_a_unit_test() -> None:
    rules = yaml.safe_load((PROMETHEUS / "kvgate-rules.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    fired = set()
    for path in (PROMETHEUS / "tests").glob("*.yml"):
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                if check.get("exp_alerts"):
                    fired.add(check["alertname"])
    assert alerts - fired == set(), "alerts without a unit test that fires them"
    assert len(alerts) >= 13


def test_the_committed_dashboards_are_the_generators_output() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "deploy" / "grafana" / "generate.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
