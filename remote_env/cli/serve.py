"""``envpool serve --config pool.yaml``: run the pool server for one EnvPool.

In-cluster it is the head pod's sidecar: the operator mounts the pool's EnvPool
document at ``/etc/envpool/pool.yaml`` and sets ``RAY_ADDRESS``,
``ENVPOOL_POOL_NAMESPACE`` and ``ENVPOOL_POOL_NAME``; the server then reports to
its EnvPool's ``status.pool`` and serves HTTP on all interfaces (the readiness
probe and Prometheus reach it through the pod IP). Elsewhere it binds loopback.

In-cluster the server watches its own EnvPool, so ``kubectl scale envpool/x
--replicas=N`` resizes the running pool within a tick; the config file is re-read
when it changes (or on SIGHUP) outside a cluster and while that watch is down. SIGTERM and
Ctrl-C stop the server and leave the env actors running for the next one, unless
``--destroy-on-exit``.

Wiring (``remote_env/cli/__init__.py``)::

    from remote_env.cli import serve
    serve.add_serve_parser(sub)   # sets fn=serve.serve
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from typing import Any

from remote_env import kubeconfig, ray_connect
from remote_env import spec as spec_mod
from remote_env.cli import argcheck
from remote_env.pool import launch, spec_source

log = logging.getLogger("remote_env.serve")

def add_serve_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``serve`` subcommand to an ``argparse`` subparsers object."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "serve",
        help="run the pool server of one EnvPool on a running Ray cluster",
        description="Create, supervise and scale one EnvPool's env actors (named, detached, "
        "in Ray namespace envpool-<name>) on a running Ray cluster; serve /metrics, /healthz "
        "and /status; in-cluster, report to the EnvPool's status.pool.",
    )
    p.add_argument("--config", "-f", default=os.environ.get("ENVPOOL_CONFIG"),
                   metavar="POOL_YAML",
                   help="EnvPool YAML (the operator's ConfigMap key pool.yaml); "
                        "default $ENVPOOL_CONFIG")
    p.add_argument("--address", default=None,
                   help="Ray address (default $RAY_ADDRESS, else 'auto': the local Ray head)")
    p.add_argument("--ray-namespace", default=None,
                   help="Ray namespace of the pool's actors (default envpool-<name>)")
    p.add_argument("--http-addr", default=None,
                   help="address for /metrics, /healthz, /status (default 0.0.0.0 in a "
                        "Kubernetes pod, else 127.0.0.1; $ENVPOOL_HTTP_ADDR)")
    p.add_argument("--http-port", type=int, default=None,
                   help="port (default spec.metrics.port; 0 = any free port)")
    p.add_argument("--lease-addr", default=None,
                   help="address of the lease API for trainers without Ray (default "
                        "$ENVPOOL_LEASE_API_HOST, else the --http-addr default)")
    p.add_argument("--lease-port", type=int, default=None,
                   help="its port (default $ENVPOOL_LEASE_API_PORT, else 8267; -1 = off). "
                        "On only with a token: the file $ENVPOOL_LEASE_TOKEN_FILE names")
    p.add_argument("--health-interval", type=float, default=1.0, metavar="SECONDS",
                   help="how often actors are pinged (default %(default)s)")
    p.add_argument("--destroy-on-exit", action="store_true",
                   help="kill the pool's actors when the server stops (default: keep them "
                        "for the next pool server)")
    p.add_argument("--connect-timeout", type=float, default=300.0, metavar="SECONDS",
                   help="how long to wait for the Ray head at start (a sidecar starts beside it; "
                        "default 300)")
    p.add_argument("--env-resource", action="store_true",
                   help=f"always place env actors by the {spec_mod.ENV_RESOURCE} resource the worker "
                        "pods advertise (the operator's RayClusters), even before any worker has "
                        "joined; default: by it once a node has it, else anywhere")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.set_defaults(fn=serve)
    argcheck.bind(p, check)
    return p


def check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse bad arguments and a bad pool file before Ray, with ``envpool serve``'s usage.

    ``parser`` is the ``serve`` subparser (``args.check(args)`` binds it).
    """
    from remote_env.pool.kube_report import KubeStatusReporter

    argcheck.at_least(parser, "--connect-timeout", args.connect_timeout, 0)
    argcheck.positive(parser, "--health-interval", args.health_interval)
    argcheck.port(parser, "--http-port", args.http_port)
    argcheck.port(parser, "--lease-port", args.lease_port, low=-1,
                  meaning="0: any free port, -1: off")
    if not args.config:
        parser.error("--config POOL_YAML is required (an EnvPool manifest; or set ENVPOOL_CONFIG)")
    try:
        spec = spec_mod.load(args.config)
    except spec_mod.SpecError as exc:
        parser.error(str(exc))
    bad_env = launch.runtime_env_error(spec.ray.runtime_env)
    if bad_env is not None:
        parser.error(f"{args.config}: spec.ray.runtimeEnv: {bad_env}")
    # In a cluster the EnvPool's status is where a pool's errors show (lastError: the
    # actors' failure, with the same text); exiting would crash-loop the sidecar instead.
    if KubeStatusReporter.from_env() is None:
        bad_id = launch.env_id_error(spec.env, spec.ray.runtime_env)
        if bad_id is not None:
            parser.error(f"{args.config}: spec.env.id: {bad_id}")


def _http_addr(args: argparse.Namespace) -> str:
    if args.http_addr:
        return str(args.http_addr)
    if os.environ.get("ENVPOOL_HTTP_ADDR"):
        return os.environ["ENVPOOL_HTTP_ADDR"]
    return kubeconfig.default_bind_address()


def serve(args: argparse.Namespace) -> int:
    """Run the pool server until SIGTERM/SIGINT; returns the exit code.

    ``args`` have passed :func:`check` (``envpool serve`` runs it first).
    """
    from remote_env.pool.kube_report import KubeStatusReporter
    from remote_env.pool.server import PoolServer

    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    spec = spec_mod.load(args.config)
    address = args.address or os.environ.get("RAY_ADDRESS") or "auto"
    namespace = args.ray_namespace or spec.ray_namespace
    try:
        # in a head pod the sidecar starts with the Ray head, whose GCS takes seconds
        # to come up (a crash there was a restart per pool). ray is first imported in
        # there: Ray's settings that bound each try are read then (ray_connect).
        ray = ray_connect.connect(address, namespace=namespace, wait_s=args.connect_timeout)
    except ConnectionError as exc:
        log.error("Ray at %s: %s", address, exc)
        print(f"envpool serve: no Ray cluster at {address} after {args.connect_timeout:.0f}s",
              file=sys.stderr)
        return 1

    stop = threading.Event()
    watcher = spec_source.ConfigFile(args.config)

    def _stop(signum: int, _frame: Any) -> None:
        log.info("signal %d: stopping", signum)
        stop.set()

    previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    if hasattr(signal, "SIGHUP"):
        previous[signal.SIGHUP] = signal.signal(signal.SIGHUP,
                                                lambda *_: watcher.reload_now.set())
    reporter = KubeStatusReporter.from_env()
    server = PoolServer(
        spec,
        http_host=_http_addr(args),
        http_port=args.http_port,
        ray_namespace=namespace,
        health_interval_s=args.health_interval,
        status_reporter=reporter,
        metrics_namespace=spec.namespace if reporter is not None else None,
        env_resource=True if args.env_resource else None,
        lease_host=args.lease_addr or os.environ.get("ENVPOOL_LEASE_API_HOST") or _http_addr(args),
        lease_port=args.lease_port,
    )

    def _apply(new: spec_mod.PoolSpec) -> None:
        try:
            server.apply_spec(new)
        except ValueError as exc:
            log.error("%s", exc)

    # In-cluster the EnvPool itself is the source (kubectl scale lands within a tick);
    # the mounted ConfigMap only while the watch is down.
    watch = (spec_source.EnvPoolWatch(reporter.namespace, reporter.name, _apply).start()
             if reporter is not None else None)

    def _reload() -> None:
        if watch is not None and watch.connected:
            return
        try:
            new = watcher.poll()
        except spec_mod.SpecError as exc:
            log.error("config changed but is invalid; keeping the running spec: %s", exc)
            return
        if new is not None:
            _apply(new)

    try:
        try:
            server.start()
        except OSError as exc:  # the HTTP port is taken or the address is not ours
            print(f"envpool serve: cannot serve HTTP on {_http_addr(args)}:"
                  f"{args.http_port if args.http_port is not None else spec.metrics_port}: {exc}",
                  file=sys.stderr)
            return 1
        log.info("pool %s: %d envs (%d per actor) in Ray namespace %s; status at %s/status",
                 spec.name, spec.desired_envs, spec.envs_per_actor, namespace, server.url)
        server.run(stop, on_tick=_reload)
        return 0
    finally:
        if watch is not None:
            watch.close()
        server.close(destroy=args.destroy_on_exit)
        if reporter is not None:
            reporter.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    """``python -m remote_env.cli.serve`` (same as ``envpool serve``)."""
    parser = argparse.ArgumentParser(prog="envpool")
    add_serve_parser(parser.add_subparsers(dest="cmd", required=True,
                                           parser_class=argcheck.SubcommandParser))
    args = parser.parse_args(["serve", *(sys.argv[1:] if argv is None else argv)])
    args.check(args)
    return int(args.fn(args))


if __name__ == "__main__":
    raise SystemExit(main())
