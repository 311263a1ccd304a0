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
