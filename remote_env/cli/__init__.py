"""``envpool`` command line: one entry point, a module per subcommand.

* ``envpool run`` (:mod:`remote_env.cli.run`): the main job: a local pool on an
  embedded Ray, stepped by a random-action driver, with progress and ``/metrics``.
* ``envpool serve`` (:mod:`remote_env.cli.serve`): the pool server of one EnvPool.
* ``envpool bench`` (:mod:`remote_env.cli.bench`): remote_env against its peers.
* ``envpool operator``: the Kubernetes operator (``envpool_operator.cli``). The one
  place remote_env reaches the operator; declared in the import contracts.
"""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    # The subcommands are imported here, not at the top: ``python -m remote_env.cli.serve``
    # imports this package first, and a ``serve`` already imported by it would be run a
    # second time as ``__main__`` (runpy's RuntimeWarning on every pool server start).
    from remote_env.cli import argcheck, bench, serve
    from remote_env.cli import run as run_cmd

    parser = argparse.ArgumentParser(
        prog="envpool", description="Remote gymnasium vector envs on Ray, run on Kubernetes."
    )
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND",
                                parser_class=argcheck.SubcommandParser)
    run_cmd.add_parser(sub)
    serve.add_serve_parser(sub)
    bench.add_parser(sub)
    sub.add_parser("operator", help="run the Kubernetes operator (envpool operator --help)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["operator"]:
        # The operator owns its flags. Imported here, not at the top, so the other
        # commands do not load kopf; the import contract names this exception.
        from envpool_operator import cli as operator_cli

        return int(operator_cli.main(argv[1:]))
    args = build_parser().parse_args(argv)
    # each subcommand's checks after parsing, reported with that subcommand's usage line
    # (``envpool run: error: ...``): the check is bound to its own parser (cli.argcheck)
    check = getattr(args, "check", None)
    if check is not None:
        check(args)
    return int(args.fn(args))
