"""One owner for each piece of the driver's state (#29), checked from the source.

``ownership.py`` holds the rules; this runs them on ``remote_env/driver``: no class
declares state only another class assigns, no class name twice, one writer per field.
"""

from __future__ import annotations

import pathlib

import ownership  # tests/static/ownership.py (pytest puts this directory on the path)

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_driver_has_one_owner_for_each_piece_of_state() -> None:
    found = ownership.check(ownership.python_files(ROOT / "remote_env" / "driver"), ROOT)
    assert found == {"stubs": [], "duplicate class names": [],
                     "fields with more than one writer": []}


def test_the_check_sees_a_mixin_split_and_a_second_writer(tmp_path: pathlib.Path) -> None:
    # the shape the driver had: a mixin declaring what its subclass assigns, and a
    # collaborator's field written from outside
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "a.py").write_text(
        "class Base:\n"
        "    calls: dict\n"
        "    def send(self):\n"
        "        self.calls.clear()\n"
        "class Env(Base):\n"
        "    def __init__(self, other):\n"
        "        self.calls = {}\n"
        "        other.busy = True\n"
        "class Other:\n"
        "    def __init__(self):\n"
        "        self.busy = False\n"
    )
    found = ownership.check(ownership.python_files(pkg), tmp_path)
    assert found["stubs"] and found["fields with more than one writer"]
