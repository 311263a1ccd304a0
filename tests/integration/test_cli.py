"""``envpool run`` as a user runs it: a subprocess, its output and exit code."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENVPOOL = [sys.executable, "-m", "remote_env.cli"]


def _run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ENVPOOL, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO)


def test_run_steps_a_local_pool_and_prints_a_summary() -> None:
    out = _run("run", "--num-envs", "4", "--envs-per-actor", "2", "--seconds", "3")
    assert out.returncode == 0, out.stderr
    assert "4 x CartPole-v1 in 2 actors ready" in out.stderr
    assert re.search(r"steps/s\s+episodes \d+\s+failures 0", out.stderr), out.stderr
    m = re.search(r"done: (\d+) steps in [\d.]+s \(\d+ steps/s\), (\d+) episodes, 0 failures",
                  out.stdout)
    assert m and int(m.group(1)) > 100 and int(m.group(2)) > 0, out.stdout


def test_run_with_a_flaky_entrypoint_restarts_and_counts() -> None:
    out = _run("run", "--entrypoint", "remote_env.examples:make_flaky_cartpole",
               "--env-kwarg", "fail_every=10", "--num-envs", "2", "--envs-per-actor", "2",
               "--seconds", "3")
    assert out.returncode == 0, out.stderr
    m = re.search(r"(\d+) failures, (\d+) env restarts, 0 actor restarts", out.stdout)
    assert m and int(m.group(1)) == int(m.group(2)) > 0, out.stdout


def test_run_awaits_async_envs_and_threads_blocking_ones() -> None:
    out = _run("run", "--entrypoint", "remote_env.examples:make_async_slow_cartpole",
               "--num-envs", "4", "--envs-per-actor", "4", "--seconds", "2")
    assert out.returncode == 0, out.stderr
    assert "4 x remote_env.examples:make_async_slow_cartpole in 1 actor (awaiting astep)" \
        in out.stderr
    out = _run("run", "--entrypoint", "remote_env.examples:make_slow_cartpole",
               "--num-envs", "4", "--envs-per-actor", "4", "--threads-per-actor", "4",
               "--transport", "ray", "--seconds", "2")
    assert out.returncode == 0, out.stderr
    assert "in 1 actor (4 threads each)" in out.stderr
    assert re.search(r"done: \d+ steps", out.stdout), out.stdout


def test_run_sends_each_actors_envs_in_splits() -> None:
    out = _run("run", "--env", "CartPole-v1", "--num-envs", "8", "--envs-per-actor", "8",
               "--splits-per-actor", "2", "--spin-us", "500", "--seconds", "2")
    assert out.returncode == 0, out.stderr
    assert "8 x CartPole-v1 in 1 actor (2 splits each)" in out.stderr
    m = re.search(r"done: (\d+) steps .* 0 failures", out.stdout)
    assert m and int(m.group(1)) > 0, out.stdout


def test_run_pool_file_runs_the_pool_server_and_a_trainer() -> None:
    out = _run("run", "-f", "manifests/examples/cartpole.yaml", "--seconds", "3")
    assert out.returncode == 0, out.stderr
    assert "pool cartpole: 16 envs ready" in out.stderr
    assert "done: " in out.stdout


def _usage_errors(cases: list[list[str]], env: dict[str, str] | None = None,
                  ) -> list[subprocess.CompletedProcess[str]]:
    """Each case's run, a few at a time (each is a Python start-up, ~2 s here)."""
    from concurrent.futures import ThreadPoolExecutor

    def one(args: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*ENVPOOL, *args], capture_output=True, text=True, timeout=120,
                              cwd=REPO, env=env)

    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(one, cases))


def _assert_usage_error(out: subprocess.CompletedProcess[str], cmd: str, msg: str) -> None:
    """argparse's form for a subcommand: its own usage line and ``envpool CMD: error:``."""
    where = (out.args, out.stderr)
    assert out.returncode == 2, where
    assert "Traceback" not in out.stderr, where
    lines = out.stderr.strip().splitlines()
    assert lines[0].startswith(f"usage: envpool {cmd} "), where  # not "usage: envpool [-h]"
    errors = [line for line in lines if ": error: " in line]
    assert len(errors) == 1 and errors[0].startswith(f"envpool {cmd}: error: "), where
    assert msg in out.stderr, where


def test_bad_input_is_a_usage_error_of_the_subcommand() -> None:
    run_cases = [
        (["--num-envs", "0"], "--num-envs must be >= 1, got 0"),
        (["--threads-per-actor", "0"], "--threads-per-actor must be >= 1, got 0"),
        (["--transport", "socket"], "invalid choice: 'socket'"),
        (["--env", "NoSuchEnv-v9"], "NoSuchEnv"),
        (["--entrypoint", "no_colon"], "entrypoint must look like 'package.module:callable'"),
        (["--entrypoint", "remote_env.examples:nope"], "has no attribute 'nope'"),
        (["-f", "/nonexistent/pool.yaml"], "pool.yaml"),
        # checked before Ray starts: a usage error, not a traceback (issue 15)
        (["--step-timeout", "-1"], "--step-timeout must be >= 0, got -1.0"),
        (["--max-restarts", "-1"], "--max-restarts must be >= 0, got -1"),
        (["--batch-wait-ms", "-1"], "--batch-wait-ms must be >= 0, got -1.0"),
        (["--batch-wait-ms", "nan"], "--batch-wait-ms must be a finite number, got nan"),
        (["--spin-us", "-5"], "--spin-us must be >= 0, got -5.0"),
        (["--spin-us", "inf"], "--spin-us must be a finite number, got inf"),
        (["--splits-per-actor", "0"], "--splits-per-actor must be >= 1, got 0"),
        (["--splits-per-actor", "1.5"], "invalid int value: '1.5'"),
        (["--seconds", "nan"], "--seconds must be > 0, got nan"),
        (["--seconds", "0"], "--seconds must be > 0, got 0.0"),
        (["--num-cpus", "-1"], "--num-cpus must be >= 0, got -1"),
        (["--metrics-port", "70000"],
         "--metrics-port must be a port in [0, 65535] (0: any free port), got 70000"),
        # argparse handed a subcommand's unknown option to the top-level parser
        (["--num-actors", "4"], "unrecognized arguments: --num-actors 4"),
    ]
    bench_cases = [
        (["--num-envs", "8", "0"], "--num-envs must be >= 1, got 0"),
        (["--seconds", "0"], "--seconds must be > 0 and finite, got 0.0"),
        (["--reps", "0"], "--reps must be >= 1, got 0"),
        (["--cpus", "0"], "--cpus must be >= 1, got 0"),
        (["--simulate-nodes", "1"], "--simulate-nodes needs 2 or more (the driver's node and "
                                    "another), got 1"),
        (["--latency", "-1"], "--latency must be >= 0, got -1.0"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ]
    cases = [("run", a, m) for a, m in run_cases] + [("bench", a, m) for a, m in bench_cases]
    for (cmd, _, msg), out in zip(cases, _usage_errors([[c, *a] for c, a, _ in cases]),
                                  strict=True):
        _assert_usage_error(out, cmd, msg)


def test_bad_serve_input_is_a_usage_error_of_serve(tmp_path: Path) -> None:
    import os

    env = {k: v for k, v in os.environ.items()
           if k not in ("ENVPOOL_CONFIG", "ENVPOOL_POOL_NAMESPACE", "ENVPOOL_POOL_NAME")}
    pool = _pool_file(tmp_path, "CartPole-v1")
    bad_id = _pool_file(tmp_path, "NoSuchEnv-v9", "bad.yaml")
    cases = [
        ([], "--config POOL_YAML is required (an EnvPool manifest; or set ENVPOOL_CONFIG)"),
        (["--config", "/nonexistent/pool.yaml"], "/nonexistent/pool.yaml"),
        (["--config", str(bad_id)], f"{bad_id}: spec.env.id: env id 'NoSuchEnv-v9' is not "
                                    "registered with gymnasium"),
        (["--config", str(pool), "--connect-timeout", "-1"],
         "--connect-timeout must be >= 0, got -1.0"),
        (["--config", str(pool), "--health-interval", "0"],
         "--health-interval must be > 0 and finite, got 0.0"),
        (["--config", str(pool), "--http-port", "70000"],
         "--http-port must be a port in [0, 65535] (0: any free port), got 70000"),
        (["--config", str(pool), "--lease-port", "-2"],
         "--lease-port must be a port in [-1, 65535] (0: any free port, -1: off), got -2"),
        (["--config", str(pool), "--adress", "x"], "unrecognized arguments: --adress x"),
    ]
    outs = _usage_errors([["serve", *a] for a, _ in cases], env=env)
    for (_, msg), out in zip(cases, outs, strict=True):
        _assert_usage_error(out, "serve", msg)


def test_bad_operator_input_is_a_usage_error_of_operator() -> None:
    (out,) = _usage_errors([["operator", "--metrics-port", "70000"]])
    _assert_usage_error(out, "operator",
                        "--metrics-port must be a port in [0, 65535] (0: off), got 70000")


def test_an_error_before_the_command_is_the_top_levels() -> None:
    (out,) = _usage_errors([["--bogus", "run"]])
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("usage: envpool [-h] COMMAND"), out.stderr
    assert "envpool: error: unrecognized arguments: --bogus" in out.stderr


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_gives_up_on_a_ray_address_where_nothing_listens(tmp_path: Path) -> None:
    # Ray's own retries made one ray.init to such an address take ~14 min (20 tries of
    # 41 s, measured); --connect-timeout bounds it. With a runtimeEnv, serve imports ray
    # before it connects (to check it): Ray's settings must still take effect.
    import os

    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", "ENVPOOL_POOL_NAMESPACE", "ENVPOOL_POOL_NAME")}
    plain = _pool_file(tmp_path, "CartPole-v1")
    with_env = _pool_file(tmp_path, "CartPole-v1", "runtime-env.yaml",
                          ray={"runtimeEnv": {"env_vars": {"A": "1"}}})
    cases = [(f, f"127.0.0.1:{_free_port()}") for f in (plain, with_env)]

    def one(case: tuple[Path, str]) -> tuple[subprocess.CompletedProcess[str], float]:
        t0 = time.monotonic()
        out = subprocess.run([*ENVPOOL, "serve", "--config", str(case[0]), "--address", case[1],
                              "--connect-timeout", "5", "--http-port", "0"],
                             capture_output=True, text=True, timeout=60, cwd=REPO, env=env)
        return out, time.monotonic() - t0

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        for (_, address), (out, took) in zip(cases, pool.map(one, cases), strict=True):
            assert out.returncode == 1, (took, out.stderr)
            assert f"envpool serve: no Ray cluster at {address} after 5s" in out.stderr, out.stderr
            assert "Traceback" not in out.stderr, out.stderr
            # one try of Ray's is 1 + 1 + 2 + 1 s with the bound (it was 41 s)
            assert "within 1 seconds" in out.stderr, out.stderr


def _pool_file(tmp_path: Path, env_id: str, name: str = "pool.yaml", **spec: object) -> Path:
    import yaml

    f = tmp_path / name
    f.write_text(yaml.safe_dump({
        "apiVersion": "envpool.dev/v1alpha1", "kind": "EnvPool", "metadata": {"name": "x"},
        "spec": {"env": {"id": env_id}, "replicas": 2, **spec},
    }))
    return f


def test_run_defaults_are_the_envpool_specs() -> None:
    # `envpool run --env X` and `envpool run -f pool.yaml` must run a pool alike; the
    # batch window is the library's (0 since issue 34: the pool's spec.batchWaitMs, 2, is
    # in the CRD and its rendered pods, and stays), which -f leaves to the pool's spec
    import argparse
    import inspect

    from remote_env import RemoteVectorEnv, spec
    from remote_env.cli import run

    sub = argparse.ArgumentParser().add_subparsers()
    run.add_parser(sub)
    args = sub.choices["run"].parse_args([])
    model = spec.parse_spec({"env": {"id": "CartPole-v1"}, "replicas": 1}, name="x")
    ft = model.fault_tolerance
    assert (args.max_restarts, args.step_timeout, args.threads_per_actor) \
        == (ft.max_restarts, ft.step_timeout_seconds, model.threads_per_actor)
    library = inspect.signature(RemoteVectorEnv).parameters["batch_wait_ms"].default
    assert args.batch_wait_ms == library == 0.0
    assert model.batch_wait_ms == 2


def test_a_runtime_env_ray_rejects_is_a_usage_error(tmp_path: Path) -> None:
    import yaml

    pool = tmp_path / "pool.yaml"
    pool.write_text(yaml.safe_dump({
        "apiVersion": "envpool.dev/v1alpha1", "kind": "EnvPool", "metadata": {"name": "x"},
        "spec": {"env": {"id": "CartPole-v1"}, "replicas": 2, "ray": {"runtimeEnv": {"pip": 5}}},
    }))
    for args in (["run", "-f", str(pool)], ["serve", "--config", str(pool)]):
        out = _run(*args, timeout=60)
        _assert_usage_error(out, args[0], f"{pool}: spec.ray.runtimeEnv: TypeError: "
                            "runtime_env['pip'] must be")


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_stops_cleanly(tmp_path: Path) -> None:
    # Files, not pipes: Ray's daemons inherit the run's stdio, and in a full suite a
    # pipe they held open kept communicate() waiting after the run had ended.
    out_path, err_path = tmp_path / "out.txt", tmp_path / "err.txt"
    with out_path.open("w") as out, err_path.open("w") as err:
        # A shell without job control starts background jobs with SIGINT ignored, and
        # Python keeps an inherited SIG_IGN: a suite started with `&` (as CI may be)
        # handed that to this child, whose Ctrl-C then did nothing. A terminal's Ctrl-C
        # reaches a process whose SIGINT is at its default: give the child that.
        proc = subprocess.Popen([*ENVPOOL, "run", "--num-envs", "2", "--envs-per-actor", "1",
                                 "--seconds", "120"], cwd=REPO, text=True, stdout=out, stderr=err,
                                preexec_fn=_default_sigint)
    try:
        deadline = time.monotonic() + 90
        # stepping has begun: the ready line or the first progress line
        while not re.search(r"ready in|steps/s", err_path.read_text()):
            assert proc.poll() is None, err_path.read_text()
            assert time.monotonic() < deadline, f"never started stepping:\n{err_path.read_text()}"
            time.sleep(0.2)
        time.sleep(1)
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    stdout, stderr = out_path.read_text(), err_path.read_text()
    assert rc == 130, stderr
    assert "done (interrupted)" in stdout


def test_python_m_serve_runs_serve_once_without_runpys_warning() -> None:
    # The package imported its subcommands at the top, so ``-m remote_env.cli.serve``
    # found the module already imported and runpy warned on every start
    out = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-m", "remote_env.cli.serve",
                          "--config", "/nonexistent.yaml"],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert "RuntimeWarning" not in out.stderr, out.stderr
    assert out.returncode == 2, out.stderr
    assert "envpool serve: error: /nonexistent.yaml: cannot read" in out.stderr, out.stderr
