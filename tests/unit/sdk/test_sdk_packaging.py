"""The SDK installs and imports on its own: httpx + pydantic + stdlib, no server code."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import rsigym

SDK_DIR = Path(__file__).resolve().parents[3] / "sdk"
PACKAGE_DIR = SDK_DIR / "rsigym"
ALLOWED_THIRD_PARTY = {"httpx", "pydantic"}


def _imported_top_level_names(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_sources_import_only_stdlib_httpx_and_pydantic():
    # rsigym/mcp (`gym mcp`, the sdk's `mcp` extra) may import the mcp SDK too: tests/unit/sdk/test_mcp_tools.py
    sources = sorted(p for p in PACKAGE_DIR.rglob("*.py") if not p.is_relative_to(PACKAGE_DIR / "mcp"))
    assert len(sources) > 5
    offenders = {
        str(path.relative_to(SDK_DIR)): sorted(bad)
        for path in sources
        if (bad := _imported_top_level_names(path) - sys.stdlib_module_names - ALLOWED_THIRD_PARTY - {"rsigym"})
    }
    assert offenders == {}


def test_import_from_a_foreign_directory_pulls_in_no_server_package(tmp_path):
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import rsigym, rsigym.cli; "
        "server = ('fastapi', 'starlette', 'sqlalchemy', 'gateway', 'services', 'typer'); "
        "bad = [m for m in server if m in sys.modules]; "
        "print(rsigym.__file__); print(bad)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(SDK_DIR)], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    file_line, bad_line = result.stdout.splitlines()
    assert Path(file_line).is_relative_to(PACKAGE_DIR)
    assert bad_line == "[]"


def test_sdk_pyproject_declares_the_distribution():
    project = tomllib.loads((SDK_DIR / "pyproject.toml").read_text())["project"]
    assert project["name"] == "rsigym-sdk"
    assert project["requires-python"] == ">=3.12"
    assert sorted(dep.split(">")[0] for dep in project["dependencies"]) == ["httpx", "pydantic"]
    assert project["scripts"] == {"gym": "rsigym.cli:main"}
    assert rsigym.__version__ == "0.1.0"


def test_public_names_are_exported():
    for name in rsigym.__all__:
        assert hasattr(rsigym, name), name
    for name in ("Gym", "AsyncGym", "BudgetExhaustedError", "Balance", "ChatCompletion", "ChildKey", "__version__"):
        assert name in rsigym.__all__
