"""TorchRL and RLlib stay optional: the library imports without them, and each adapter
says what to install."""

from __future__ import annotations

import subprocess
import sys

import pytest

_WITHOUT = """
import sys
sys.modules[{module!r}] = None  # as if not installed
import remote_env.driver.vector
assert sys.modules.get("torchrl") is None and sys.modules.get("ray.rllib") is None
try:
    import remote_env.{adapter}
except ImportError as exc:
    print(exc)
"""


@pytest.mark.parametrize(("module", "adapter", "says"), [
    ("torchrl", "torchrl", "envpool-k8s[frameworks]"),
    ("ray.rllib", "rllib", "ray[rllib]"),
])
def test_library_imports_without_the_framework_and_the_adapter_names_it(
        module: str, adapter: str, says: str) -> None:
    code = _WITHOUT.format(module=module, adapter=adapter)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert says in out, out
