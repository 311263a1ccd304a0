"""The pool, the spec model and the operator keep one owner per piece of state (the
checks of ``ownership.py``, #29), and the pool server makes env actors without loading
trainer (driver) code."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import ownership  # tests/static is on sys.path: pytest's rootdir-relative import

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = (ROOT / "remote_env" / "pool", ROOT / "remote_env" / "spec",
            ROOT / "operator" / "envpool_operator")


def test_pool_spec_and_operator_have_one_owner_per_piece_of_state() -> None:
    files = [f for place in PACKAGES for f in ownership.python_files(place)]
    found = ownership.check(files, ROOT)
    assert found == {"stubs": [], "duplicate class names": [],
                     "fields with more than one writer": []}, found


def test_the_pool_server_makes_actors_without_the_driver() -> None:
    code = ("import sys\n"
            "from remote_env.pool import launch, server\n"
            "launcher = launch.ActorLauncher(ray_namespace='ns', actor_options={})\n"
            "assert launcher.actor_class() is launcher.actor_class()\n"
            "assert not [m for m in sys.modules if m.startswith('remote_env.driver')], "
            "sorted(sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
