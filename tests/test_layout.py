"""The package layout's rules that import-linter cannot express: no module imports a private
name (``_x``) from another top-level package; the product's modules stay under 500 lines and
few of its functions over 60; tests sit in the folder of the package they test."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("kvgate", "gateway", "epp", "backends", "policies", "loadtest", "bench", "tests")
PRODUCT = ("kvgate", "gateway", "epp", "backends", "policies", "loadtest")
MAX_FILE_LINES = 500
LONG_FUNCTION = 60  # lines
MAX_LONG_FUNCTIONS = 8  # a ratchet: lower it as long functions are split, never raise it


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


def product_modules() -> list[Path]:
    return [
        path
        for package in PRODUCT
        for path in sorted((ROOT / package).rglob("*.py"))
        if not path.name.endswith(("_pb2.py", "_pb2_grpc.py"))
    ]


def long_functions(source: str) -> list[tuple[str, int]]:
    """(name, lines) of each function of ``source`` longer than ``LONG_FUNCTION`` lines."""
    return [
        (node.name, lines)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (lines := (node.end_lineno or node.lineno) - node.lineno + 1) > LONG_FUNCTION
    ]


def test_no_module_of_the_product_is_over_500_lines() -> None:
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in product_modules()}
    assert {name: n for name, n in sizes.items() if n > MAX_FILE_LINES} == {}


def test_few_functions_of_the_product_are_over_60_lines() -> None:
    found = [
        f"{path.relative_to(ROOT)}: {name} ({lines})"
        for path in product_modules()
        for name, lines in long_functions(path.read_text())
    ]
    assert len(found) <= MAX_LONG_FUNCTIONS, found


def test_the_function_check_counts_lines() -> None:
    body = "".join(f"    x = {i}\n" for i in range(LONG_FUNCTION))
    assert long_functions(f"def long():\n{body}\ndef short():\n    pass\n") == [
        ("long", LONG_FUNCTION + 1)
    ]


def test_tests_sit_with_the_package_they_test() -> None:
    """A test folder named after a package imports that package (``tests/wire``: the shared
    wire layer, ``kvgate.wire``), so its tests are found where its code is."""
    folders = {"wire": "kvgate.wire", **{p: p for p in PACKAGES if p not in ("kvgate", "tests")}}
    strays = []
    for folder, package in folders.items():
        for path in sorted((ROOT / "tests" / folder).glob("test_*.py")):
            tree = ast.parse(path.read_text())
            modules = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
            if not any(m == package or m.startswith(package + ".") for m in modules):
                strays.append(str(path.relative_to(ROOT)))
    assert strays == []
