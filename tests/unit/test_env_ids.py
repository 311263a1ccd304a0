"""An env id from a user, wherever it is resolved (``envpool run --env``, ``run -f`` and
``serve``'s spec, the pool's env factory, RLlib's creator): an unknown id fails with
gymnasium's own error class and text ("Did you mean" included), naming the id and the
forms expected; the CLI says so in one usage line (exit 2) before Ray starts. Ids
``gymnasium.make`` accepts (``module:EnvId``, an unversioned name) are accepted."""

from __future__ import annotations

import sys
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import pytest

from remote_env import cli, entrypoints, ray_connect, spec
from remote_env.cli import run as run_cmd
from remote_env.cli import serve as serve_cmd
from remote_env.pool import launch

EXPECTED = ("'CartPole-v1'", "'module:EnvId'")


@pytest.fixture
def registering_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    """A module of "another package" that registers an env when imported: (module, id)."""
    tag = uuid.uuid4().hex[:8]
    module, env_id = f"small_envpkg_{tag}", f"SmallPkg{tag}/Thing-v0"
    (tmp_path / f"{module}.py").write_text(
        "import gymnasium as gym\n"
        f"gym.register({env_id!r}, entry_point='gymnasium.envs.classic_control:CartPoleEnv')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        yield module, env_id
    finally:
        gym.registry.pop(env_id, None)
        sys.modules.pop(module, None)


@pytest.mark.parametrize(("env_id", "error", "says"), [
    ("NoSuchEnv-v9", gym.error.NameNotFound, "Environment `NoSuchEnv` doesn't exist."),
    ("CartPol-v1", gym.error.NameNotFound, "Did you mean: `CartPole`?"),  # gymnasium's hint kept
    ("CartPole-v9", gym.error.VersionNotFound, "It provides versioned environments"),
    ("nosuchns/Bar-v0", gym.error.NamespaceNotFound, "Namespace nosuchns not found"),
    ("remote_env.examples:NoSuch-v0", gym.error.NameNotFound,
     "(importing 'remote_env.examples' did not register 'NoSuch-v0')"),
    ("no_such_module_xyz:Bar-v0", ModuleNotFoundError,
     "cannot import 'no_such_module_xyz', the module that should register 'Bar-v0'"),
    ("a:b:c", gym.error.Error, "has more than one ':'"),
])
def test_an_unknown_id_names_itself_and_the_forms_expected(
        env_id: str, error: type[Exception], says: str) -> None:
    with pytest.raises(error) as info:
        entrypoints.env_spec(env_id, instead="--entrypoint package.module:callable")
    text = str(info.value)
    assert f"env id {env_id!r}" in text and says in text, text
    assert all(e in text for e in EXPECTED) and "--entrypoint package.module:callable" in text
    if error is not gym.error.Error:  # gymnasium's own error, kept as the cause
        assert isinstance(info.value.__cause__, error)
    if error in (gym.error.NameNotFound, gym.error.VersionNotFound, gym.error.NamespaceNotFound):
        assert "is not registered with gymnasium" in text


def test_the_ids_gymnasium_make_accepts_are_accepted(registering_module: tuple[str, str]) -> None:
    module, env_id = registering_module
    # gym.spec() refused the last two, which gym.make (and so the actors) accept
    assert entrypoints.env_spec("CartPole-v1").id == "CartPole-v1"
    with pytest.warns(UserWarning, match="latest versioned environment `CartPole-v1`"):
        assert entrypoints.env_spec("CartPole").id == "CartPole-v1"  # as make does
    assert entrypoints.env_spec(f"{module}:{env_id}").id == env_id
    env = entrypoints.EnvFactory(f"{module}:{env_id}", None)()
    assert env.spec.id == env_id
    env.close()


def test_the_factory_says_an_unknown_id_and_leaves_the_envs_own_errors_alone() -> None:
    with pytest.raises(gym.error.NameNotFound,
                       match=r"env id 'NoSuchEnv-v9' is not registered .*spec\.env\.entrypoint"):
        entrypoints.EnvFactory("NoSuchEnv-v9", None)()
    # an env whose own constructor makes an unknown env: gymnasium's text, not "our" id's
    inner = f"SmallOuter{uuid.uuid4().hex[:8]}-v0"
    gym.register(inner, entry_point=lambda: gym.make("NoSuchInner-v0"))
    try:
        with pytest.raises(gym.error.NameNotFound) as info:
            entrypoints.EnvFactory(inner, None)()
        assert str(info.value) == "Environment `NoSuchInner` doesn't exist."
    finally:
        gym.registry.pop(inner, None)


@pytest.fixture
def no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bad input must be refused before the CLI asks for Ray."""
    def connect(*_: object, **__: object) -> None:
        raise ConnectionError("the command asked for Ray")

    monkeypatch.setattr(ray_connect, "connect", connect)


def _error_line(capsys: pytest.CaptureFixture[str], cmd: str) -> str:
    """The one error line after the subcommand's usage (which may wrap)."""
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert lines[0].startswith(f"usage: envpool {cmd} "), err
    (line,) = [ln for ln in lines if ": error: " in ln]  # one line says it all
    assert line == lines[-1], err
    return line


def test_envpool_run_refuses_an_unknown_id_in_one_usage_line(
        capsys: pytest.CaptureFixture[str], no_ray: None) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["run", "--env", "CartPol-v1"])
    assert info.value.code == 2
    line = _error_line(capsys, "run")
    assert line.startswith("envpool run: error: env id 'CartPol-v1' is not registered with "
                           "gymnasium: Environment `CartPol` doesn't exist. Did you mean: "
                           "`CartPole`?"), line
    assert all(e in line for e in EXPECTED) and "--entrypoint package.module:callable" in line


def test_envpool_run_accepts_what_the_actors_gym_make_accepts(
        registering_module: tuple[str, str]) -> None:
    module, env_id = registering_module
    parser = cli.build_parser()
    for given in (f"{module}:{env_id}", "CartPole"):
        args = parser.parse_args(["run", "--env", given])
        with warnings.catch_warnings():  # gymnasium's "latest versioned" for "CartPole"
            warnings.simplefilter("ignore", UserWarning)
            args.check(args)  # run_cmd.check: no usage error (it was one for both)
        assert isinstance(run_cmd._env_fn(args), entrypoints.EnvFactory)


def _pool_file(tmp_path: Path, env: str, **spec_fields: object) -> Path:
    import yaml

    f = tmp_path / "pool.yaml"
    f.write_text(yaml.safe_dump({
        "apiVersion": "envpool.dev/v1alpha1", "kind": "EnvPool", "metadata": {"name": "bad"},
        "spec": {"env": {"id": env}, "replicas": 2, **spec_fields}}))
    return f


def test_envpool_run_f_refuses_a_spec_with_an_unknown_id_before_ray(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], no_ray: None) -> None:
    f = _pool_file(tmp_path, "NoSuchEnv-v9")
    with pytest.raises(SystemExit) as info:
        cli.main(["run", "-f", str(f)])
    assert info.value.code == 2
    line = _error_line(capsys, "run")
    assert line.startswith(f"envpool run: error: {f}: spec.env.id: env id 'NoSuchEnv-v9' is not "
                           "registered with gymnasium"), line
    assert "spec.env.entrypoint: 'package.module:callable'" in line


def test_envpool_serve_refuses_an_unknown_id_before_it_connects_to_ray(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        no_ray: None) -> None:
    for var in ("ENVPOOL_POOL_NAMESPACE", "ENVPOOL_POOL_NAME"):
        monkeypatch.delenv(var, raising=False)
    f = _pool_file(tmp_path, "NoSuchEnv-v9")
    with pytest.raises(SystemExit) as info:
        serve_cmd.main(["--config", str(f)])
    assert info.value.code == 2
    line = _error_line(capsys, "serve")
    assert line.startswith(f"envpool serve: error: {f}: spec.env.id: env id 'NoSuchEnv-v9' is "
                           "not registered with gymnasium: Environment `NoSuchEnv` doesn't "
                           "exist."), line
    # In a cluster the pool's status says it (lastError, from the actors): the sidecar
    # runs on rather than crash-loop, so it goes on to Ray
    monkeypatch.setenv("ENVPOOL_POOL_NAMESPACE", "rl")
    monkeypatch.setenv("ENVPOOL_POOL_NAME", "bad")
    assert serve_cmd.main(["--config", str(f), "--connect-timeout", "0"]) == 1
    assert "no Ray cluster" in capsys.readouterr().err


def test_a_specs_id_is_checked_where_this_process_decides_it() -> None:
    env = spec.parse_spec({"env": {"id": "NoSuchEnv-v9"}, "replicas": 1}, name="x").env
    assert "env id 'NoSuchEnv-v9' is not registered" in str(launch.env_id_error(env, {}))
    # a runtimeEnv may bring the registering package; a module: id would import user
    # code in the pool server: the actors say it (with the same text) instead
    assert launch.env_id_error(env, {"pip": ["some-envs"]}) is None
    mod = spec.parse_spec({"env": {"id": "no_such_mod:X-v0"}, "replicas": 1}, name="x").env
    assert launch.env_id_error(mod, {}) is None
    ok = spec.parse_spec({"env": {"id": "CartPole-v1"}, "replicas": 1}, name="x").env
    assert launch.env_id_error(ok, {}) is None


def test_the_spec_refuses_an_id_gymnasium_cannot_split() -> None:
    with pytest.raises(spec.SpecError, match=r"spec\.env\.id: expected a gymnasium id such as "
                       r"CartPole-v1, or 'module:EnvId' .* got 'a:b:c'"):
        spec.parse_spec({"env": {"id": "a:b:c"}, "replicas": 1}, name="x")

