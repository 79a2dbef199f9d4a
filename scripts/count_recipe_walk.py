"""Count the walk of a recipe name through the harness, statically.

    python scripts/count_recipe_walk.py [--root src] [--start MODULE.FUNCTION] [--param NAME] [--quiet]

Nothing is imported or run: every module under the root is parsed with `ast`. The walk
(printed with its result, as DEFINITION below) starts at `--start` (default
kiln.usecases.build.build_recipe) with `--param` (default `name`; `recipe` for that start) tracked, and
prints each stop (function, module) in visit order, the number of distinct modules, and
how many times the walk returns to a module it had left.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

DEFINITION = """\
walk: depth first from the start function, its tracked parameter the recipe name.
  recipe type: a class defined in a module named by --types (default: the modules of
    kiln.domain.recipes and kiln.domain.images.definitions): the recipe as loaded or
    resolved, its overrides, its images.
  tracked value, inside one function: a tracked parameter, or a local name assigned
    (=, annotated =, :=, for, with ... as) from
    - an expression with no call in it that mentions a tracked value (`loaded.recipe.engine`,
      `resolved.loaded, resolved.recipe_image`),
    - a call of a builtin (`sorted`, `list`, ...) with a tracked argument,
    - a conditional, tuple, list or `and`/`or` one of whose parts is one of these, or
    - a call (or an attribute of one) with a tracked argument, of a function of the package
      whose return annotation names a recipe type (`load_recipe(recipe_dir(name))`,
      `resolve(name).engine_image`).
  followed call: a call, in source order, one of whose arguments mentions a tracked value
    (an argument that is text, an f-string or a string joined with `+` or `%`, is a message
    about the recipe, not the recipe: it is not counted),
    to a function or class of the package the callee expression names statically: a
    function of this module, a name imported from a module of the package, `module.f` of
    an imported module, `self.m` inside a class, or a class (its `__init__`). A method
    called on any other receiver is not followed (its type is not known without running).
  in the callee, the parameters those arguments bind are tracked; each function is
    visited once (its first call), and is one stop (--every-call: each later call of it
    is a stop too, its body not walked again).
  return: a stop in another module than the stop before it, in a module an earlier stop
    was in (the walk had left that module and came back)."""

TYPES = ("kiln.domain.recipes", "kiln.domain.images.definitions")


@dataclass
class _Module:
    name: str
    tree: ast.Module
    functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = field(default_factory=dict)
    imports: dict[str, str] = field(default_factory=dict)  # local name -> dotted target
    classes: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Stop:
    module: str
    function: str


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _index(root: Path) -> dict[str, _Module]:
    modules: dict[str, _Module] = {}
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        name = _module_name(root, path)
        mod = _Module(name, ast.parse(path.read_text(), str(path)))
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in mod.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                mod.functions[node.name] = node
            elif isinstance(node, ast.ClassDef):
                mod.classes.add(node.name)
                mod.functions[node.name] = _init_of(node)
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        mod.functions[f"{node.name}.{item.name}"] = item
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    mod.imports[alias.asname or alias.name.split(".")[0]] = (
                        alias.name if alias.asname else alias.name.split(".")[0]
                    )
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, *([base] if base else [])])
                for alias in node.names:
                    mod.imports[alias.asname or alias.name] = f"{base}.{alias.name}"
        modules[name] = mod
    return modules


def _init_of(cls: ast.ClassDef) -> ast.FunctionDef | ast.AsyncFunctionDef:
    """A class called is its `__init__` (a class without one: a stop with no parameters)."""
    for item in cls.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == "__init__":
            return item
    return ast.FunctionDef(
        name=cls.name, args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[])
    )


def _dotted(expr: ast.expr) -> str | None:
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        base = _dotted(expr.value)
        return f"{base}.{expr.attr}" if base is not None else None
    return None


class _Walk:
    def __init__(self, modules: dict[str, _Module], types: tuple[str, ...], every_call: bool = False) -> None:
        self.modules = modules
        self.every_call = every_call
        self.types = {c for m in modules.values() if m.name.startswith(types) for c in m.classes}
        self.stops: list[Stop] = []
        self.seen: set[tuple[str, str]] = set()

    def resolve(self, module: _Module, cls: str | None, func: ast.expr) -> tuple[_Module, str] | None:
        """The package's function (module, qualified name) a call expression names, or None."""
        dotted = _dotted(func)
        if dotted is None:
            return None
        head, _, rest = dotted.partition(".")
        if head == "self" and cls is not None and rest and "." not in rest:
            key = f"{cls}.{rest}"
            return (module, key) if key in module.functions else None
        if not rest and head in module.functions:
            return module, head
        target = module.imports.get(head)
        if target is None:
            return None
        full = f"{target}.{rest}" if rest else target
        mod_name, _, attr = full.rpartition(".")
        # `module.f`, `package.module.f`: the longest module prefix the package has
        while mod_name and mod_name not in self.modules:
            mod_name, _, more = mod_name.rpartition(".")
            attr = f"{more}.{attr}"
        owner = self.modules.get(mod_name)
        if owner is None or attr not in owner.functions:
            return None
        return owner, attr

    def taint(
        self, module: _Module, cls: str | None, func: ast.FunctionDef | ast.AsyncFunctionDef, tracked: set[str]
    ) -> set[str]:
        """The tracked parameters and every local name assigned from them (to a fixpoint)."""
        tainted = set(tracked)
        while True:
            before = len(tainted)
            for node in ast.walk(func):
                for target, value in _assignments(node):
                    if self.carries(module, cls, value, tainted):
                        tainted.update(_targets(target))
            if len(tainted) == before:
                return tainted

    def carries(self, module: _Module, cls: str | None, value: ast.expr, tainted: set[str]) -> bool:
        """Whether a value assigned from `value` is tracked (DEFINITION)."""
        if not _mentions(value, tainted):
            return False
        if isinstance(value, ast.IfExp):  # `x if c else y`, `(x, y)`, `x or y`: either side
            return any(self.carries(module, cls, v, tainted) for v in (value.body, value.orelse))
        if isinstance(value, (ast.Tuple, ast.List, ast.BoolOp)):
            parts = value.values if isinstance(value, ast.BoolOp) else value.elts
            return any(self.carries(module, cls, v, tainted) for v in parts)
        if not any(isinstance(n, ast.Call) for n in ast.walk(value)):
            return True
        base = value
        while isinstance(base, (ast.Attribute, ast.Subscript)):
            base = base.value
        if not isinstance(base, ast.Call):
            return False
        if not any(_mentions(a, tainted) for a in [*base.args, *(k.value for k in base.keywords)]):
            return False
        if isinstance(base.func, ast.Name) and base.func.id in _BUILTINS and base.func.id not in module.functions:
            return True
        found = self.resolve(module, cls, base.func)
        if found is None:
            return False
        owner, qualname = found
        if qualname in owner.classes:
            return qualname in self.types
        returned = owner.functions[qualname].returns
        return returned is not None and bool(_names(returned) & self.types)

    def visit(self, module: _Module, qualname: str, tracked: set[str]) -> None:
        if (module.name, qualname) in self.seen:
            if self.every_call:  # called again: a stop again, its body not walked again
                self.stops.append(Stop(module.name, qualname))
            return
        self.seen.add((module.name, qualname))
        self.stops.append(Stop(module.name, qualname))
        func = module.functions[qualname]
        cls = qualname.split(".", maxsplit=1)[0] if "." in qualname else None
        tainted = self.taint(module, cls, func, tracked)
        for call in _calls_in_order(func):
            args = [a for a in (*call.args, *(k.value for k in call.keywords)) if not _is_message(a)]
            if not any(_mentions(a, tainted) for a in args):
                continue
            found = self.resolve(module, cls, call.func)
            if found is None:
                continue
            callee_mod, callee = found
            self.visit(callee_mod, callee, _bound(callee_mod.functions[callee], call, tainted))


def _is_message(expr: ast.expr) -> bool:
    """Text made from the recipe (an f-string, or a string joined with `+` or `%`): a message
    about it, not the recipe."""
    if isinstance(expr, ast.JoinedStr):
        return True
    return isinstance(expr, ast.BinOp) and any(
        isinstance(side, (ast.JoinedStr, ast.Constant)) and not isinstance(getattr(side, "value", ""), (int, float))
        for side in (expr.left, expr.right)
    )


def _mentions(expr: ast.AST, names: set[str]) -> bool:
    return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(expr))


def _targets(node: ast.AST) -> Iterator[str]:
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            yield n.id


_BUILTINS = frozenset(dir(builtins))


def _names(annotation: ast.expr) -> set[str]:
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        annotation = ast.parse(annotation.value, mode="eval").body
    return {
        n.id if isinstance(n, ast.Name) else n.attr
        for n in ast.walk(annotation)
        if isinstance(n, (ast.Name, ast.Attribute))
    }


def _assignments(node: ast.AST) -> list[tuple[ast.AST, ast.expr]]:
    if isinstance(node, ast.Assign):
        return [(t, node.value) for t in node.targets]
    if isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)) and node.value is not None:
        return [(node.target, node.value)]
    if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
        return [(node.target, node.iter)]
    if isinstance(node, (ast.With, ast.AsyncWith)):
        return [(i.optional_vars, i.context_expr) for i in node.items if i.optional_vars is not None]
    return []


def _calls_in_order(func: ast.AST) -> list[ast.Call]:
    calls = [n for n in ast.walk(func) if isinstance(n, ast.Call)]
    return sorted(calls, key=lambda c: (c.lineno, c.col_offset))


def _bound(callee: ast.FunctionDef | ast.AsyncFunctionDef, call: ast.Call, tainted: set[str]) -> set[str]:
    """The callee's parameters that the call's tracked arguments bind."""
    params = [a.arg for a in (*callee.args.posonlyargs, *callee.args.args)]
    if params and params[0] in ("self", "cls"):
        params = params[1:]
    out = set()
    for i, arg in enumerate(call.args):
        if isinstance(arg, ast.Starred) or not _mentions(arg, tainted):
            continue
        if i < len(params):
            out.add(params[i])
        elif callee.args.vararg is not None:
            out.add(callee.args.vararg.arg)
    for kw in call.keywords:
        if _mentions(kw.value, tainted):
            if kw.arg is None and callee.args.kwarg is not None:
                out.add(callee.args.kwarg.arg)
            elif kw.arg is not None:
                out.add(kw.arg)
    return out


def _returning(stops: list[Stop]) -> set[int]:
    """Indexes of the stops in a module the walk had left (DEFINITION)."""
    out = set()
    for i in range(1, len(stops)):
        mod = stops[i].module
        if mod != stops[i - 1].module and any(s.module == mod for s in stops[:i]):
            out.add(i)
    return out


def returns(stops: list[Stop]) -> int:
    """How many times the walk comes back to a module it had left."""
    return len(_returning(stops))


def walk(root: Path, start: str, param: str, types: tuple[str, ...] = TYPES, every_call: bool = False) -> list[Stop]:
    modules = _index(root)
    mod_name, _, func = start.rpartition(".")
    if mod_name not in modules or func not in modules[mod_name].functions:
        raise SystemExit(f"count_recipe_walk: no function {start} under {root}")
    w = _Walk(modules, types, every_call)
    w.visit(modules[mod_name], func, {param})
    return w.stops


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent / "src")
    parser.add_argument("--start", default="kiln.usecases.build.build_recipe")
    parser.add_argument("--param", default="name")
    parser.add_argument("--types", nargs="+", default=list(TYPES), help="modules whose classes are recipe types")
    parser.add_argument(
        "--every-call", action="store_true", help="a function called again is a stop again (its body walked once)"
    )
    parser.add_argument("--quiet", action="store_true", help="only the three numbers")
    args = parser.parse_args(argv)
    stops = walk(args.root, args.start, args.param, tuple(args.types), args.every_call)
    if not args.quiet:
        print(DEFINITION)
        print()
        back = _returning(stops)
        for i, stop in enumerate(stops):
            print(f"{i + 1:3} {stop.module}  {stop.function}{'  <- return' if i in back else ''}")
        print()
    print(f"stops: {len(stops)}")
    print(f"modules: {len({s.module for s in stops})}")
    print(f"returns to a module it had left: {returns(stops)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
