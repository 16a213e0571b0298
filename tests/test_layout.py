"""The package layout's rules that import-linter cannot express: no module imports a private
name (``_x``) from another top-level package."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("kvgate", "gateway", "epp", "backends", "policies", "loadtest", "bench", "tests")


def private_imports(source: str, own: str) -> list[str]:
    """``module: name`` for each private name ``source`` (a module of package ``own``)
    imports from another package."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom) or not node.module or node.level:
            continue
        top = node.module.split(".")[0]
        if top == own or top not in PACKAGES:
            continue
        found += [f"{node.module}: {a.name}" for a in node.names if a.name.startswith("_")]
    return found


def test_no_module_imports_a_private_name_of_another_package() -> None:
    offenders = {
        str(path.relative_to(ROOT)): names
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if (names := private_imports(path.read_text(), package))
    }
    assert offenders == {}


def test_the_check_sees_a_private_import() -> None:
    planted = "from kvgate.wire.http.client import Public, _hidden\nfrom gateway import _own\n"
    assert private_imports(planted, "loadtest") == [
        "kvgate.wire.http.client: _hidden",
        "gateway: _own",
    ]
    assert private_imports(planted, "gateway") == ["kvgate.wire.http.client: _hidden"]
