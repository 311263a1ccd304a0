"""``envpool operator``: run the EnvPool operator (kopf) in this process.

    envpool operator --all-namespaces --liveness http://0.0.0.0:8080/healthz
    envpool operator -n team-a -n team-b --metrics-port 8000 --standalone

Without ``--namespace`` or ``--all-namespaces`` the namespaces come from
``ENVPOOL_WATCH_NAMESPACES`` (comma-separated), and all of them if it is empty.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="envpool operator",
        description="Reconcile EnvPool resources into KubeRay RayClusters.",
    )
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", default=[], metavar="NS",
                       help="watch this namespace (repeatable; glob patterns allowed)")
    scope.add_argument("-A", "--all-namespaces", action="store_true",
                       help="watch every namespace")
    p.add_argument("--liveness", metavar="URL", default=None,
                   help="serve kopf's liveness probe, e.g. http://0.0.0.0:8080/healthz")
    p.add_argument("--metrics-port", type=int, default=None, metavar="N",
                   help="port for the operator's /metrics (0 disables; default "
                        "$ENVPOOL_OPERATOR_METRICS_PORT or 8000)")
    p.add_argument("--metrics-addr", default=None, metavar="ADDR",
                   help="address for /metrics (default $ENVPOOL_OPERATOR_METRICS_ADDR, else "
                        "0.0.0.0 in a Kubernetes pod and 127.0.0.1 elsewhere)")
    p.add_argument("--standalone", action="store_true",
                   help="no peering: do not coordinate with other operator instances")
    p.add_argument("--peering", default=None, metavar="NAME",
                   help="kopf peering object name (several operators, one active)")
    p.add_argument("-v", "--verbose", action="store_true", help="log more")
    p.add_argument("--debug", action="store_true", help="log everything kopf does")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the operator until SIGINT/SIGTERM; returns the process exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.metrics_port is not None and not 0 <= args.metrics_port <= 65535:
        # argparse's form and exit code 2, with this command's usage line
        parser.error(f"--metrics-port must be a port in [0, 65535] (0: off), got "
                     f"{args.metrics_port}")
    # Imported here so `envpool --help` does not pay for kopf and kubernetes.
    import kopf

    from envpool_operator import handlers, settings

    cfg = settings.from_env()
    if args.metrics_port is not None:
        cfg = dataclasses.replace(cfg, metrics_port=args.metrics_port)
    if args.metrics_addr is not None:
        cfg = dataclasses.replace(cfg, metrics_addr=args.metrics_addr)
    namespaces = list(args.namespace) or ([] if args.all_namespaces else list(cfg.namespaces))
    kopf.configure(verbose=args.verbose, debug=args.debug)
    assert handlers.reconcile_fn  # registered on import
    kopf.run(
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=args.liveness,
        standalone=args.standalone or None,
        peering_name=args.peering,
        # exact names (no globs): kopf need not list namespaces (see handlers.configure)
        memo=kopf.Memo(envpool_settings=cfg, envpool_exact_namespaces=bool(namespaces) and not any(
            c in ns for ns in namespaces for c in "*?[!")),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
