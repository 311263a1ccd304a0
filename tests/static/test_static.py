"""Type checking, lint and import layering are part of the test suite."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _run(*cmd: str) -> None:
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_strict() -> None:
    _run(str(BIN / "mypy"))


def test_ruff() -> None:
    _run(str(BIN / "ruff"), "check", "remote_env", "operator", "tests")


def test_import_layers() -> None:
    _run(str(BIN / "lint-imports"))


def test_test_module_names_are_unique() -> None:
    # the test directories are not packages: pytest imports each module by its base
    # name, so two test_x.py in different directories stop the whole run at collection
    seen: dict[str, Path] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        other = seen.setdefault(path.name, path)
        assert other == path, f"{path} and {other} share a base name: rename one"
