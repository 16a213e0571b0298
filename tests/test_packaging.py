"""The built wheel installs next to proto-plus without replacing its top-level ``proto``."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]

CHECK = """
import importlib.util, proto
assert hasattr(proto, "Message"), proto.__file__
spec = importlib.util.find_spec("kvgate.api.epp_pb2")
assert spec is not None and spec.origin, "kvgate.api.epp_pb2 is not installed"
from kvgate.api import epp_pb2
assert epp_pb2.DESCRIPTOR.package == "kvgate.epp.v1"
print("ok", proto.__file__)
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(ROOT)],
        check=True,
    )
    (built,) = out.glob("kvgate-*.whl")
    return built


def test_wheel_has_no_top_level_proto(wheel: Path) -> None:
    tops = {name.split("/", 1)[0] for name in zipfile.ZipFile(wheel).namelist()}
    packages = {t for t in tops if not t.endswith((".dist-info", ".data"))}
    assert packages == {"kvgate", "gateway", "epp", "policies", "backends", "loadtest"}


@pytest.mark.slow
def test_wheel_installs_beside_proto_plus(wheel: Path, tmp_path: Path) -> None:
    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env)
    python = str(env / "bin" / "python")
    pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "proto-plus>=1.24"], check=True)
    subprocess.run([*pip, "--no-deps", str(wheel)], check=True)
    done = subprocess.run([python, "-c", CHECK], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "proto/__init__.py" in done.stdout  # proto-plus's own package, still in place


def test_wheel_carries_the_license_its_metadata_names(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    licenses = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
    assert len(licenses) == 1
    text = zipfile.ZipFile(wheel).read(licenses[0]).decode()
    assert text.lstrip().startswith("Apache License") and "Version 2.0" in text
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    assert "License-Expression: Apache-2.0" in zipfile.ZipFile(wheel).read(metadata).decode()


def _owned_files() -> dict[str, list[str]]:
    """Every file an installed distribution's RECORD lists (compiled caches and the
    distributions' own metadata aside), with the distributions that list it."""
    owners: dict[str, list[str]] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        for path in dist.files or ():
            text = path.as_posix()
            if text.endswith(".pyc") or ".dist-info/" in text or ".egg-info/" in text:
                continue
            owners.setdefault(text, []).append(name)
    return owners


def test_no_two_installed_distributions_own_the_same_file() -> None:
    """Two wheels writing one path install in whichever order pip picks, and the last one
    wins: an import then works on one machine and fails on the next."""
    shared = {
        path: sorted(set(names)) for path, names in _owned_files().items() if len(set(names)) > 1
    }
    assert not shared, f"{len(shared)} files owned twice, e.g. {sorted(shared.items())[:5]}"


def test_every_installed_distribution_is_the_pinned_version() -> None:
    """The venv the tests run in is the one constraints.txt describes (a range in
    pyproject.toml alone lets a new release change what is tested)."""
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[_normalized(name)] = version
    installed = {
        _normalized(dist.metadata["Name"]): dist.version.split("+")[0]
        for dist in importlib.metadata.distributions()
    }
    missing = sorted(name for name in pins if name not in installed)
    assert not missing, f"pinned but not installed: {missing}"
    differ = {n: (installed[n], pins[n]) for n in pins if installed[n] != pins[n]}
    assert not differ, f"installed versions differ from constraints.txt: {differ}"


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
