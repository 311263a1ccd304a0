"""Stable-Baselines3 stays optional: the library imports without it, and the adapter
says which extra to install."""

from __future__ import annotations

import subprocess
import sys

_WITHOUT_SB3 = """
import sys
sys.modules["stable_baselines3"] = None  # as if not installed
import remote_env.driver.vector
assert "torch" not in sys.modules
try:
    import remote_env.sb3
except ImportError as exc:
    print(exc)
"""


def test_library_imports_without_sb3_and_the_adapter_names_the_extra() -> None:
    out = subprocess.run([sys.executable, "-c", _WITHOUT_SB3], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert "envpool-k8s[frameworks]" in out and "stable-baselines3" in out
