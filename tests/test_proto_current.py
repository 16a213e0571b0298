"""The committed gRPC code matches every .proto under proto/ (run `make proto` after editing)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PROTOS = sorted((ROOT / "proto").rglob("*.proto"))


def _descriptor_line(path: Path) -> str:
    return next(line for line in path.read_text().splitlines() if "AddSerializedFile" in line)


def _method_lines(path: Path, package: str) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if f"'/{package}." in line]


def test_protos_exist() -> None:
    assert [p.relative_to(ROOT).as_posix() for p in PROTOS] == [
        "proto/kvgate/api/envoy/base.proto",
        "proto/kvgate/api/envoy/external_processor.proto",
        "proto/kvgate/api/envoy/http_status.proto",
        "proto/kvgate/api/epp.proto",
        "proto/kvgate/api/kv_transfer.proto",
    ]


@pytest.mark.parametrize("source", PROTOS, ids=lambda p: p.name)
def test_generated_code_is_current(source: Path, tmp_path: Path) -> None:
    relative = source.relative_to(ROOT / "proto")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{ROOT / 'proto'}",
            f"--python_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            str(source),
        ],
        check=True,
    )
    stem = relative.with_suffix("")
    fresh_dir, committed_dir = tmp_path / stem.parent, ROOT / stem.parent
    name = stem.name
    assert _descriptor_line(fresh_dir / f"{name}_pb2.py") == _descriptor_line(
        committed_dir / f"{name}_pb2.py"
    ), "run `make proto`"
    package = next(
        line.split()[1].rstrip(";")
        for line in source.read_text().splitlines()
        if line.startswith("package ")
    )
    fresh_grpc = _method_lines(fresh_dir / f"{name}_pb2_grpc.py", package)
    declares_service = any(line.startswith("service ") for line in source.read_text().splitlines())
    assert bool(fresh_grpc) == declares_service, f"service methods of {package}: {fresh_grpc}"
    assert fresh_grpc == _method_lines(committed_dir / f"{name}_pb2_grpc.py", package)
