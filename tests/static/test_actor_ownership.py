"""The actor side keeps one owner per piece of state (the checks of ``ownership.py``,
#29) and its Ray actor class is made without the driver."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import ownership  # tests/static is on sys.path: pytest's rootdir-relative import

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_actor_package_has_one_owner_per_piece_of_state() -> None:
    found = ownership.check(ownership.python_files(ROOT / "remote_env" / "actor"), ROOT)
    assert found == {"stubs": [], "duplicate class names": [],
                     "fields with more than one writer": []}, found


def test_the_checks_catch_a_mixin_split(tmp_path: pathlib.Path) -> None:
    # what the actor host was: a mixin declaring state its subclass assigns, and a
    # record written by two classes
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text(
        "class Mixin:\n    _lock: int\n    def f(self, slot):\n        slot.env = 1\n"
        "class Host(Mixin):\n    def __init__(self):\n        self._lock = 0\n"
        "class Slot:\n    def __init__(self):\n        self.env = None\n")
    found = ownership.check(ownership.python_files(tmp_path / "pkg"), tmp_path)
    assert len(found["stubs"]) == 1 and len(found["fields with more than one writer"]) == 1


def test_the_actor_class_is_made_without_the_driver() -> None:
    code = ("import sys\n"
            "from remote_env.actor import host\n"
            "cls = host.actor_class()\n"
            "assert cls is host.actor_class()\n"
            "assert not [m for m in sys.modules if m.startswith(('remote_env.driver', "
            "'remote_env.pool', 'remote_env.cli'))], sorted(sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
