"""One owner for each piece of state: the checks behind ``test_ownership.py``.

Read from the source with :mod:`ast` (nothing is imported), so it also runs as a
script on one part of the tree: ``python tests/static/ownership.py remote_env/driver``.

The rules (the one-owner issue, #29):

- **no stubs:** no class declares an annotation-only attribute (``x: int`` in the class
  body, not a record) that only another class assigns; that is a mixin split, the state
  belongs to a collaborator;
- **one name, one class:** no class name is defined twice in a package;
- **one writer:** a field (an attribute one class of the package defines) is assigned by
  that class alone: not by a subclass, a sibling mixin or another object reaching in
  (``other._field = ...``). A record (dataclass, NamedTuple) may be written by the one
  class that owns the records, never by two.
"""

from __future__ import annotations

import ast
import collections
import pathlib
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

RECORD_BASES = ("NamedTuple", "TypedDict", "Protocol", "Enum", "IntEnum", "StrEnum", "Exception")


@dataclass(frozen=True)
class ClassInfo:
    name: str
    module: str
    line: int
    record: bool
    bases: tuple[str, ...]
    stubs: tuple[str, ...]  # annotation-only attributes of a non-record class
    fields: tuple[str, ...]  # what it defines: self.x = in its methods, or record fields


@dataclass(frozen=True)
class Write:
    attr: str
    writer: str  # "module:Class" or "module:<function>" that assigns it
    on_self: bool
    line: int


def _is_record(node: ast.ClassDef) -> bool:
    if any("dataclass" in ast.unparse(d) for d in node.decorator_list):
        return True
    return any(
        ast.unparse(b).split(".")[-1].split("[")[0] in RECORD_BASES
        or ast.unparse(b).endswith("Error")
        for b in node.bases
    )


def _targets(node: ast.AST) -> Iterator[ast.expr]:
    if isinstance(node, ast.Assign):
        for t in node.targets:
            yield from _flatten(t)
    elif isinstance(node, ast.AugAssign) or (isinstance(node, ast.AnnAssign) and node.value):
        yield from _flatten(node.target)


def _flatten(t: ast.expr) -> Iterator[ast.expr]:
    if isinstance(t, (ast.Tuple, ast.List)):
        for e in t.elts:
            yield from _flatten(e)
    else:
        yield t


def _self_name(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    args = fn.args.posonlyargs + fn.args.args
    if not args or any(ast.unparse(d) == "staticmethod" for d in fn.decorator_list):
        return None
    return args[0].arg


def scan(paths: Iterable[pathlib.Path], root: pathlib.Path) -> tuple[list[ClassInfo], list[Write]]:
    classes: list[ClassInfo] = []
    writes: list[Write] = []
    for path in paths:
        module = path.relative_to(root).with_suffix("").as_posix().replace("/", ".")
        tree = ast.parse(path.read_text(), str(path))
        for top in ast.walk(tree):
            if isinstance(top, ast.ClassDef):
                record = _is_record(top)
                stubs = tuple(
                    s.target.id
                    for s in top.body
                    if isinstance(s, ast.AnnAssign)
                    and s.value is None
                    and isinstance(s.target, ast.Name)
                )
                own: set[str] = set(stubs) if record else set()
                if record:
                    own |= {
                        s.target.id
                        for s in top.body
                        if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                    }
                for fn in top.body:
                    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        continue
                    me = _self_name(fn)
                    for n in ast.walk(fn):
                        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                                and n.func.id == "setattr" and n.args
                                and isinstance(n.args[0], ast.Name) and n.args[0].id == me):
                            # setattr(self, name, ...): fields named at run time, the
                            # class's own declared ones (its annotations say which)
                            for stub in stubs:
                                own.add(stub)
                                writes.append(Write(stub, f"{module}:{top.name}", True,
                                                    n.lineno))
                        for t in _targets(n):
                            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name):
                                on_self = t.value.id == me
                                if on_self:
                                    own.add(t.attr)
                                writes.append(
                                    Write(t.attr, f"{module}:{top.name}", on_self, t.lineno)
                                )
                classes.append(
                    ClassInfo(
                        top.name,
                        module,
                        top.lineno,
                        record,
                        tuple(ast.unparse(b).split(".")[-1] for b in top.bases),
                        () if record else stubs,
                        tuple(sorted(own)),
                    )
                )
        for fn in tree.body:  # module functions reaching into objects
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for n in ast.walk(fn):
                    for t in _targets(n):
                        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name):
                            writes.append(Write(t.attr, f"{module}:<{fn.name}>", False, t.lineno))
    return classes, writes


def stub_violations(classes: list[ClassInfo], writes: list[Write]) -> list[str]:
    by_class: dict[str, set[str]] = collections.defaultdict(set)
    for w in writes:
        if w.on_self:
            by_class[w.attr].add(w.writer.split(":")[1])
    return [
        f"{c.module}:{c.name}.{a} is declared there but assigned only by "
        f"{', '.join(sorted(by_class[a]))}"
        for c in classes
        for a in c.stubs
        if by_class[a] and c.name not in by_class[a]
    ]


def duplicate_names(classes: list[ClassInfo]) -> list[str]:
    where: dict[str, list[str]] = collections.defaultdict(list)
    for c in classes:
        where[c.name].append(c.module)
    return [
        f"class {n} is defined in {', '.join(ms)}" for n, ms in sorted(where.items()) if len(ms) > 1
    ]


def writer_violations(classes: list[ClassInfo], writes: list[Write]) -> list[str]:
    """Fields with more than one writer, for fields exactly one class defines."""
    definers: dict[str, list[ClassInfo]] = collections.defaultdict(list)
    for c in classes:
        for f in c.fields:
            definers[f].append(c)
    # A subclass writing its base's field is a second writer of the same state.
    family: dict[str, set[str]] = {c.name: {c.name} for c in classes}
    for c in classes:
        for b in c.bases:
            if b in family:
                family[c.name].add(b)
    out = []
    for attr, owners in sorted(definers.items()):
        names = {c.name for c in owners}
        related = len(owners) > 1 and any(family.get(a, set()) & (names - {a}) for a in names)
        if len(owners) != 1 and not related:
            continue  # a name several unrelated classes use: not attributable by name
        ws = {w.writer for w in writes if w.attr == attr}
        if related or len(ws) > 1:
            out.append(
                f"{attr!r} ({', '.join(sorted(f'{c.module}:{c.name}' for c in owners))}) "
                f"is written by {', '.join(sorted(ws))}"
            )
    return out


def check(paths: Iterable[pathlib.Path], root: pathlib.Path) -> dict[str, list[str]]:
    classes, writes = scan(paths, root)
    return {
        "stubs": stub_violations(classes, writes),
        "duplicate class names": duplicate_names(classes),
        "fields with more than one writer": writer_violations(classes, writes),
    }


def python_files(place: pathlib.Path) -> list[pathlib.Path]:
    return sorted(place.rglob("*.py")) if place.is_dir() else [place]


if __name__ == "__main__":
    root = pathlib.Path(__file__).resolve().parents[2]
    places = [root / a for a in sys.argv[1:]] or [root / "remote_env"]
    found = check([p for place in places for p in python_files(place)], root)
    for kind, items in found.items():
        print(f"{kind}: {len(items)}")
        for item in items:
            print(f"  {item}")
    sys.exit(1 if any(found.values()) else 0)
