"""A subcommand's argument errors, reported against that subcommand.

argparse reports a value it refuses against the parser that parsed it: ``usage:
envpool run ...`` and ``envpool run: error: ...``, exit 2. A check made after parsing
(a range, a file's content) must do the same, so each subcommand hands its own parser
to its check (:func:`bind`), never the top-level ``envpool`` one, whose usage line
says nothing about the option that was wrong. An option the subcommand does not know
is argparse's own gap: :class:`SubcommandParser`.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterable
from typing import Any


class SubcommandParser(argparse.ArgumentParser):
    """A subcommand's parser (``add_subparsers(parser_class=...)``) that refuses an
    option it does not know itself.

    argparse hands a subparser's leftovers up to the top-level parser, which then says
    ``usage: envpool [-h] COMMAND ...`` / ``envpool: error: unrecognized arguments``:
    the usage line of the command that was not wrong.
    """

    def parse_known_args(self, *args: Any, **kwargs: Any) -> Any:
        parsed, extras = super().parse_known_args(*args, **kwargs)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras


Check = Callable[[argparse.ArgumentParser, argparse.Namespace], None]


def bind(parser: argparse.ArgumentParser, check: Check) -> None:
    """Make ``args.check(args)`` run ``check`` with the subcommand's own ``parser``."""
    def bound(args: argparse.Namespace) -> None:
        check(parser, args)

    parser.set_defaults(check=bound)


def at_least(parser: argparse.ArgumentParser, flag: str, value: float | None,
             low: float) -> None:
    """``value >= low`` (``None``: not given, passes); a float must also be finite."""
    if value is None:
        return
    if isinstance(value, float) and not math.isfinite(value):  # NaN passes a plain < low
        parser.error(f"{flag} must be a finite number, got {value}")
    if value < low:
        parser.error(f"{flag} must be >= {low}, got {value}")


def each_at_least(parser: argparse.ArgumentParser, flag: str, values: Iterable[float] | None,
                  low: float) -> None:
    """:func:`at_least` for every value of a ``nargs`` option."""
    for value in values or ():
        at_least(parser, flag, value, low)


def positive(parser: argparse.ArgumentParser, flag: str, value: float | None, *,
             inf_ok: bool = False) -> None:
    """``value > 0`` (``None`` passes); ``inf`` only with ``inf_ok`` ("until stopped")."""
    if value is None:
        return
    if math.isnan(value) or value <= 0 or (math.isinf(value) and not inf_ok):
        parser.error(f"{flag} must be > 0{'' if inf_ok else ' and finite'}, got {value}")


def port(parser: argparse.ArgumentParser, flag: str, value: int | None, *, low: int = 0,
         meaning: str = "0: any free port") -> None:
    """A TCP port in ``[low, 65535]`` (``None`` passes)."""
    if value is not None and not low <= value <= 65535:
        parser.error(f"{flag} must be a port in [{low}, 65535] ({meaning}), got {value}")
