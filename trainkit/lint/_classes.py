"""Which ``def`` a ``self.f(...)`` runs: the class's own, or one inherited from a class of the same file.

A Trainer base class defines ``training_step``; a subclass's ``fit()`` calls
``self.training_step(batch)``. :func:`find_method` walks the method resolution order (C3, as
Python computes it) of the file's own classes and stops, finding nothing, at the first class in
that order it cannot read: a base that is not a plain name of a class defined once at module level
(imported, ``base.Trainer``, defined twice, rebound by ``Trainer = ...``, decorated, or built with a
keyword other than an ``ABCMeta`` metaclass), since that base may define ``f`` too. The first class
in the order that binds ``f`` decides: its one ``def f`` (the caller checks its decorators), or nothing when it binds ``f`` another way (``training_step = None``) or twice.
"""
from __future__ import annotations

import ast
from typing import Dict, List, Optional, Set, Tuple, Union

Function = Union[ast.FunctionDef, ast.AsyncFunctionDef]
# A class of the linearisation: one of the file's, or the source text of a base it cannot read.
_Entry = Union[ast.ClassDef, Tuple[str, str]]

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _binds(stmt: ast.stmt, name: str) -> bool:
    """Whether a statement of a class body (other than a ``def``) binds ``name``."""
    for node in ast.walk(stmt):
        if isinstance(node, ast.Name) and node.id == name and not isinstance(node.ctx, ast.Load):
            return True
        if isinstance(node, (ast.ClassDef, ast.Import, ast.ImportFrom)):
            names = [node.name] if isinstance(node, ast.ClassDef) else [(a.asname or a.name).split(".")[0]
                                                                         for a in node.names]
            if name in names:
                return True
    return False


class Classes:
    """The file's module-level classes that a base name can be read as (built once per file)."""

    def __init__(self, tree: ast.Module, module_names: Set[str]) -> None:
        found: Dict[str, List[ast.ClassDef]] = {}
        for stmt in tree.body:
            if isinstance(stmt, ast.ClassDef):
                found.setdefault(stmt.name, []).append(stmt)
        self.by_name = {name: defs[0] for name, defs in found.items()
                        if len(defs) == 1 and name not in module_names}
        self._mro: Dict[int, Optional[List[_Entry]]] = {}

    def _readable(self, base: ast.expr) -> Optional[ast.ClassDef]:
        """The class ``base`` names, when the file defines it plainly (see the module)."""
        cls = self.by_name.get(base.id) if isinstance(base, ast.Name) else None
        if cls is None or cls.decorator_list:
            return None
        for keyword in cls.keywords:
            value = keyword.value
            name = value.id if isinstance(value, ast.Name) else getattr(value, "attr", None)
            if keyword.arg != "metaclass" or name != "ABCMeta":
                return None
        return cls

    def mro(self, cls: ast.ClassDef, seen: Tuple[int, ...] = ()) -> Optional[List[_Entry]]:
        """C3 linearisation of ``cls`` over the file's classes; a base it cannot read is one opaque
        entry (its own bases unknown, so nothing after it is trusted). None when inconsistent."""
        if id(cls) in seen:
            return None  # a cycle: not Python that runs
        if id(cls) not in self._mro:
            tails: List[List[_Entry]] = []
            heads: List[_Entry] = []
            for base in cls.bases:
                if isinstance(base, ast.Name) and base.id == "object":
                    continue
                known = self._readable(base)
                line = self.mro(known, seen + (id(cls),)) if known is not None else [("?", ast.dump(base))]
                if line is None:
                    self._mro[id(cls)] = None
                    return None
                tails.append(list(line))
                heads.append(line[0])
            self._mro[id(cls)] = _merge([cls], tails + [heads])
        return self._mro[id(cls)]

    def find_method(self, cls: ast.ClassDef, name: str) -> Optional[Function]:
        """The ``def name`` that ``self.name`` runs in a method of ``cls`` (see the module)."""
        order = self.mro(cls)
        for entry in order or []:
            if isinstance(entry, tuple):
                return None  # a base the file does not define: it may define `name`
            defs = [s for s in entry.body if isinstance(s, _FUNCTIONS) and s.name == name]
            other = any(_binds(s, name) for s in entry.body if not isinstance(s, _FUNCTIONS))
            if defs or other:
                return defs[0] if len(defs) == 1 and not other else None
        return None


def _same(a: _Entry, b: _Entry) -> bool:
    return a is b if isinstance(a, ast.ClassDef) else a == b


def _merge(out: List[_Entry], lines: List[List[_Entry]]) -> Optional[List[_Entry]]:
    """C3's merge: take the first head that is in no other line's tail, until all lines are empty."""
    lines = [line for line in lines if line]
    while lines:
        for line in lines:
            head = line[0]
            if not any(_same(head, e) for other in lines for e in other[1:]):
                break
        else:
            return None  # no consistent order: Python refuses the class
        out.append(head)
        lines = [[e for e in line if not _same(e, head)] for line in lines]
        lines = [line for line in lines if line]
    return out
