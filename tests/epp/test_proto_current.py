"""The committed gRPC code matches proto/epp.proto (run `make proto` after editing it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def _descriptor_line(path: Path) -> str:
    return next(line for line in path.read_text().splitlines() if "AddSerializedFile" in line)


def test_generated_code_is_current(tmp_path: Path) -> None:
    (tmp_path / "proto").mkdir()
    (tmp_path / "proto" / "epp.proto").write_text((ROOT / "proto" / "epp.proto").read_text())
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I.",
            "--python_out=.",
            "--grpc_python_out=.",
            "proto/epp.proto",
        ],
        cwd=tmp_path,
        check=True,
    )
    fresh, committed = tmp_path / "proto" / "epp_pb2.py", ROOT / "proto" / "epp_pb2.py"
    assert _descriptor_line(fresh) == _descriptor_line(committed), "run `make proto`"
    methods = [
        line.strip()
        for line in (tmp_path / "proto" / "epp_pb2_grpc.py").read_text().splitlines()
        if "'/kvgate.epp.v1." in line
    ]
    committed_methods = [
        line.strip()
        for line in (ROOT / "proto" / "epp_pb2_grpc.py").read_text().splitlines()
        if "'/kvgate.epp.v1." in line
    ]
    assert methods == committed_methods
