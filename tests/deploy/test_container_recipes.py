"""The container recipes: each Dockerfile's install step is the script `make check-images`
runs in CI (so what CI checks is what an image build does), and each image's command and the
manifests' container arguments parse with kvgate's own command line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from kvgate.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "deploy" / "docker"


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    text = dockerfile.read_text().replace("\\\n", " ")
    return [
        (line.split(None, 1)[0], line.split(None, 1)[1].strip())
        for line in text.splitlines()
        if line.strip() and not line.startswith("#") and len(line.split(None, 1)) == 2
    ]


def test_each_recipe_installs_with_the_script_ci_runs() -> None:
    checked = (DOCKER / "check-images.sh").read_text()
    for recipe, script in (("gateway", "install-gateway.sh"), ("backend", "install-backend.sh")):
        steps = instructions(DOCKER / f"{recipe}.Dockerfile")
        runs = [args for op, args in steps if op == "RUN"]
        assert any(f"sh /src/deploy/docker/{script} /opt/kvgate /src" in r for r in runs), runs
        assert f'deploy/docker/{script}" "$work/' in checked
        # nothing else is installed by hand in the final image
        final = steps[max(i for i, (op, _) in enumerate(steps) if op == "FROM") :]
        assert not [a for op, a in final if op == "RUN" and "pip install" in a]


def test_the_images_commands_and_the_manifests_arguments_parse() -> None:
    parser = build_parser()
    for recipe in ("gateway", "backend"):
        steps = dict(instructions(DOCKER / f"{recipe}.Dockerfile"))
        assert json.loads(steps["ENTRYPOINT"]) == ["kvgate"]
        parser.parse_args(json.loads(steps["CMD"]))
    base = ROOT / "deploy" / "kubernetes" / "base"
    commands = 0
    for path in base.glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") != "Deployment":
                continue
            for container in doc["spec"]["template"]["spec"]["containers"]:
                if re.match(r"ghcr.io/kvgate/kvgate(:|$)", container["image"]):
                    parser.parse_args(container["args"])
                    commands += 1
    assert commands == 2  # the gateway and the EPP
