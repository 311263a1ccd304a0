"""One owner for each piece of state (#29), checked from the source, and the sides
loaded apart: the actor class without the driver, the pool server without the driver.

``ownership.py`` holds the rules: no class declares state only another class assigns
(a mixin split), no class name twice, one writer per field.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import ownership  # tests/static/ownership.py (pytest puts this directory on the path)

ROOT = pathlib.Path(__file__).resolve().parents[2]
#: demo envs written in PettingZoo's and gymnasium's own style (a subclass sets its
#: base's ``possible_agents``, as PettingZoo envs do): the library's rules are not theirs
NOT_LIBRARY = {ROOT / "remote_env" / "examples.py"}


def _library() -> list[pathlib.Path]:
    files = [*ownership.python_files(ROOT / "remote_env"),
             *ownership.python_files(ROOT / "operator" / "envpool_operator")]
    return [f for f in files if f not in NOT_LIBRARY]


def test_every_piece_of_state_has_one_owner() -> None:
    found = ownership.check(_library(), ROOT)
    assert found == {"stubs": [], "duplicate class names": [],
                     "fields with more than one writer": []}, found


def test_the_checks_catch_a_mixin_split_a_second_writer_and_a_name_twice(
        tmp_path: pathlib.Path) -> None:
    # the shape the driver and the actor host had: a mixin declaring what its subclass
    # assigns, a collaborator's field written from outside, and one name for two roles
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
    (pkg / "b.py").write_text("class Other:\n    pass\n")
    found = ownership.check(ownership.python_files(pkg), tmp_path)
    assert len(found["stubs"]) == 1 and "Base.calls" in found["stubs"][0]
    assert found["duplicate class names"] == ["class Other is defined in pkg.a, pkg.b"]
    assert any("'busy'" in f for f in found["fields with more than one writer"])


def test_state_set_with_setattr_counts_as_its_own(tmp_path: pathlib.Path) -> None:
    (tmp_path / "views.py").write_text(
        "class Views:\n"
        "    obs: list\n"
        "    def __init__(self, fields):\n"
        "        for f in fields:\n"
        "            setattr(self, f, [])\n"
        "class Other:\n"
        "    def __init__(self):\n"
        "        self.obs = 1\n")
    found = ownership.check([tmp_path / "views.py"], tmp_path)
    assert found["stubs"] == []


def _loads_apart(code: str) -> None:
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_the_actor_class_is_made_without_the_driver() -> None:
    _loads_apart("import sys\n"
                 "from remote_env.actor import host\n"
                 "cls = host.actor_class()\n"
                 "assert cls is host.actor_class()\n"
                 "assert not [m for m in sys.modules if m.startswith(('remote_env.driver', "
                 "'remote_env.pool', 'remote_env.cli'))], sorted(sys.modules)\n")


def test_the_pool_server_makes_actors_without_the_driver() -> None:
    _loads_apart("import sys\n"
                 "from remote_env.pool import launch, server\n"
                 "launcher = launch.ActorLauncher(ray_namespace='ns', actor_options={})\n"
                 "assert launcher.actor_class() is launcher.actor_class()\n"
                 "assert not [m for m in sys.modules if m.startswith('remote_env.driver')], "
                 "sorted(sys.modules)\n")
