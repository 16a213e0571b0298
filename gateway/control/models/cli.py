"""``kvgate models list|promote|rollback|archive``: the model registry through a running
gateway's admin API (``listen.admin``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request

from gateway.control.models.stages import ACTIONS

DEFAULT_ADMIN = "http://127.0.0.1:8081"
TIMEOUT = 10.0  # seconds


class Refused(Exception):
    """The admin API refused, or could not be reached (the message says which)."""


def _call(args: argparse.Namespace, path: str, method: str = "GET") -> dict[str, object]:
    """The admin API's JSON answer; ``Refused`` with its error message otherwise."""
    token = args.token or os.environ.get("KVGATE_ADMIN_TOKEN", "")
    request = urllib.request.Request(
        args.admin.rstrip("/") + path,
        method=method,
        headers={"Authorization": f"Bearer {token}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            body: dict[str, object] = json.loads(response.read())
            return body
    except urllib.error.HTTPError as exc:
        try:
            error = json.loads(exc.read())["error"]["message"]
        except (ValueError, KeyError, TypeError):
            error = exc.reason
        raise Refused(f"{exc.code}: {error}") from None
    except OSError as exc:
        raise Refused(f"cannot reach the admin API at {args.admin}: {exc}") from None


def _run(args: argparse.Namespace) -> int:
    try:
        return _act(args) if args.models_command in ACTIONS else _list(args)
    except Refused as exc:
        print(f"kvgate models {args.models_command}: {exc}", file=sys.stderr)
        return 1


def _list(args: argparse.Namespace) -> int:
    models = _call(args, "/admin/models")
    if args.json:
        print(json.dumps(models, indent=1))
        return 0
    print(f"{'MODEL':<20} {'VERSION':<10} {'STAGE':<11} {'SHARE':>7}  POOL")
    for name, model in models.items():
        assert isinstance(model, dict)
        for v in model["versions"]:
            share = f"{v['share']:.1f}%"
            print(f"{name:<20} {v['version']:<10} {v['stage']:<11} {share:>7}  {v['pool']}")
        print(f"{'':<20} {_canary_line(model['canary'])}; SLO: {_slo_line(model['slo'])}")
    return 0


def _canary_line(canary: dict[str, object] | None) -> str:
    if canary is None:
        return "no canary"
    line = f"canary {canary['status']}"
    if "weight" in canary:
        steps = canary["steps"]
        assert isinstance(steps, list) and isinstance(canary["step"], int)
        line += f", step {canary['step'] + 1} of {len(steps)} at {canary['weight']:g}%"
    held = canary.get("held_by_budget")
    if isinstance(held, float):
        line += f" (held: {held:.0%} of the error budget spent)"
    return line


def _slo_line(slo: dict[str, object]) -> str:
    spent = slo["budget_spent"]
    spent_text = f"{spent:.0%} of the error budget spent, " if isinstance(spent, float) else ""
    return f"{spent_text}{slo['verdict']}"


def _act(args: argparse.Namespace) -> int:
    model, version = urllib.parse.quote(args.model, safe=""), urllib.parse.quote(args.version)
    summary = _call(args, f"/admin/models/{model}/{version}/{args.models_command}", "POST")
    stages = {v["version"]: v["stage"] for v in summary["versions"]}  # type: ignore[attr-defined]
    print(f"{args.model} {args.version}: {stages[args.version]}")
    print(" ".join(f"{v}={s}" for v, s in stages.items()))
    return 0


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("models", help="the model registry: list versions, change stages")
    p.add_argument("--admin", default=DEFAULT_ADMIN, help="the gateway's admin API")
    p.add_argument("--token", help="an admin key (default: $KVGATE_ADMIN_TOKEN)")
    commands = p.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    listing = commands.add_parser("list", help="versions, stages, traffic shares, SLO verdicts")
    listing.add_argument("--json", action="store_true", help="the admin API's answer as is")
    listing.set_defaults(func=_run)
    for action in ACTIONS:
        c = commands.add_parser(action, help=_HELP[action])
        c.add_argument("model", help="the public model name")
        c.add_argument("version")
        c.set_defaults(func=_run)


_HELP = {
    "promote": "staging -> canary (the automatic canary starts), canary -> production, "
    "archived -> staging",
    "rollback": "canary -> archived; production -> archived, its predecessor restored",
    "archive": "staging or canary -> archived",
}
