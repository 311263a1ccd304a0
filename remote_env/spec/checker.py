"""Checks of single values against :data:`remote_env.spec.fields.FIELDS`.

A :class:`Checker` collects every problem (so the user sees all of them at once),
each as ``"<path>: <what was wrong, what was expected>"``. Stdlib only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from remote_env.spec import fields, model

_SUFFIX: Final[dict[str, float]] = {
    "": 1.0, "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
    "P": 1e15, "E": 1e18, "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40,
    "Pi": 2.0**50, "Ei": 2.0**60,
}


class SpecError(ValueError):
    """An EnvPool spec that cannot be run; ``errors`` lists every problem.

    ``source`` (a file name, say) prefixes the message when given.
    """

    def __init__(self, errors: Sequence[str], source: str = "") -> None:
        self.errors = list(errors)
        self.source = source
        super().__init__((f"{source}: " if source else "") + "; ".join(self.errors))


def parse_quantity(text: str) -> float:
    """A Kubernetes quantity as a float (``"500m"`` -> 0.5, ``"1Gi"`` -> 2**30).

    Raises:
        ValueError: ``text`` is not an unsigned quantity.
    """
    if not fields.QUANTITY_RE.match(text):
        raise ValueError(f"not a quantity: {text!r}")
    m = re.match(r"^([0-9.]+)(.*)$", text)
    assert m is not None  # QUANTITY_RE guarantees a leading number
    number, suffix = m.group(1), m.group(2)
    if suffix in _SUFFIX:
        return float(number) * _SUFFIX[suffix]
    return float(number + suffix)  # decimal exponent, e.g. "1e3"


def _range(f: fields.Field) -> str:
    if f.type == "integer":
        return f"[{f.minimum:.0f}, {f.maximum:.0f}]"
    return f"[{f.minimum:g}, {f.maximum:g}]"


class Checker:
    """Collects problems; each typed getter returns a usable value even on error."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def fail(self, path: str, message: str) -> None:
        self.errors.append(f"{path}: {message}")

    def mapping(self, value: Any, path: str) -> Mapping[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.fail(path, f"expected an object, got {type(value).__name__} {value!r}")
            return {}
        return value

    def known(self, value: Mapping[str, Any], path: str, kind: str | None = None) -> None:
        """Fail on keys that are not fields of object ``kind`` (default: ``path``)."""
        known = fields.OBJECTS[kind or path]
        for key in value:
            if key not in known:
                self.fail(f"{path}.{key}", f"unknown field (expected one of {', '.join(known)})")

    def boolean(self, value: Mapping[str, Any], path: str, default: bool | None = None) -> bool:
        """``default`` overrides the field's (a model default the CRD does not state)."""
        f = fields.FIELDS[path]
        fallback = f.default if default is None else default
        got = value.get(path.rsplit(".", 1)[1], fallback)
        if not isinstance(got, bool):
            self.fail(path, f"expected true or false, got {got!r}")
            return bool(fallback)
        return got

    def integer(self, value: Mapping[str, Any], path: str, default: int | None = None) -> int:
        """``default`` overrides the field's (for defaults derived from other fields)."""
        f = fields.FIELDS[path]
        assert f.minimum is not None and f.maximum is not None
        lo, hi = int(f.minimum), int(f.maximum)
        got = value.get(path.rsplit(".", 1)[1], f.default if default is None else default)
        if got is None:
            self.fail(path, f"required: an integer in {_range(f)}")
            return lo
        if isinstance(got, bool) or not isinstance(got, int):
            self.fail(path, f"expected an integer in {_range(f)}, got {got!r}")
            return lo
        if not lo <= got <= hi:
            self.fail(path, f"must be in {_range(f)}, got {got}")
            return max(lo, min(hi, got))
        return got

    def number(self, value: Mapping[str, Any], path: str) -> float:
        f = fields.FIELDS[path]
        assert f.minimum is not None and f.maximum is not None
        got = value.get(path.rsplit(".", 1)[1], f.default)
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            self.fail(path, f"expected a number in {_range(f)}, got {got!r}")
            return float(f.default)
        if not f.minimum <= got <= f.maximum:
            self.fail(path, f"must be in {_range(f)}, got {got:g}")
            return float(f.default)
        return float(got)

    def string(self, value: Mapping[str, Any], path: str) -> str | None:
        f = fields.FIELDS[path]
        got = value.get(path.rsplit(".", 1)[1], f.default)
        if got is None:
            return None
        if not isinstance(got, str):
            self.fail(path, f"expected a string, got {got!r}")
            return f.default  # type: ignore[no-any-return]
        if f.enum is not None and got not in f.enum:
            self.fail(path, f"expected one of {', '.join(f.enum)}, got {got!r}")
            return f.default  # type: ignore[no-any-return]
        self.length(got, path, f.min_length, f.max_length)
        return got

    def length(self, got: str, path: str, lo: int | None, hi: int | None) -> None:
        if lo is not None and len(got) < lo:
            self.fail(path, f"must be at least {lo} characters, got {got!r}")
        if hi is not None and len(got) > hi:
            self.fail(path, f"must be at most {hi} characters, got {len(got)}")

    def count(self, items: Any, path: str, most: int) -> None:
        if len(items) > most:
            self.fail(path, f"at most {most} entries, got {len(items)}")

    def resources(self, value: Any, path: str) -> model.Resources:
        res = self.mapping(value, path)
        self.known(res, path, "resources")
        parsed: dict[str, dict[str, str]] = {}
        amounts: dict[str, dict[str, float]] = {}
        for part in ("requests", "limits"):
            parsed[part], amounts[part] = {}, {}
            block = self.mapping(res.get(part), f"{path}.{part}")
            self.count(block, f"{path}.{part}", fields.MAX_QUANTITIES)
            for res_name, qty in block.items():
                amount = self._quantity(qty, f"{path}.{part}.{res_name}", res_name)
                if amount is not None:
                    parsed[part][res_name] = str(qty)
                    amounts[part][res_name] = amount
        for res_name, req in amounts["requests"].items():
            lim = amounts["limits"].get(res_name)
            if lim is not None and req > lim:
                self.fail(
                    f"{path}.requests.{res_name}",
                    f"request {parsed['requests'][res_name]} exceeds limit "
                    f"{parsed['limits'][res_name]}",
                )
        return model.Resources(requests=parsed["requests"], limits=parsed["limits"])

    def _quantity(self, qty: Any, where: str, res_name: str) -> float | None:
        if isinstance(qty, bool) or not isinstance(qty, (int, str)):
            self.fail(where, f"expected a quantity such as 500m or 2Gi, got {qty!r}")
            return None
        text = str(qty)
        if len(text) > fields.MAX_QUANTITY_LENGTH:
            self.fail(where, f"must be at most {fields.MAX_QUANTITY_LENGTH} characters")
            return None
        try:
            amount = parse_quantity(text)
        except ValueError:
            self.fail(where, f"expected a quantity such as 500m or 2Gi, got {text!r}")
            return None
        if amount <= 0:
            self.fail(where, f"must be greater than zero, got {text!r}")
            return None
        if res_name == "memory" and amount < fields.MIN_RAY_MEMORY_BYTES:
            self.fail(where, f"Ray needs at least 256Mi of memory, got {text!r}")
        return amount
