"""privatize's scopes: which binding a name at a position refers to, scope by scope (module,
function, class, comprehension), so that a rename covers every use and leaves a parameter
or local of the same name alone."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field


# -- scopes --------------------------------------------------------------------------------
@dataclass(eq=False)
class Scope:
    kind: str  # module, function, class, comprehension
    parent: Scope | None
    bound: set[str] = field(default_factory=set)
    globals: set[str] = field(default_factory=set)
    nonlocals: set[str] = field(default_factory=set)
    loads: set[str] = field(default_factory=set)

    def binding_scope(self) -> Scope:
        """Where a walrus inside a comprehension binds."""
        scope = self
        while scope.kind == "comprehension" and scope.parent is not None:
            scope = scope.parent
        return scope


_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


class ScopeWalker:
    """Every Name of a module with the scope it is read or bound in; then which of them
    are the module-level binding of a name (Python's rules: function scopes skip class
    bodies, `global`/`nonlocal`, comprehension scopes, walrus)."""

    def __init__(self, tree: ast.Module) -> None:
        self.module = Scope("module", None)
        self.names: list[tuple[ast.Name, Scope]] = []
        self.annotations: list[tuple[ast.Constant, Scope]] = []  # string annotations
        self.defs: list[tuple[ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef, Scope]] = []
        self.globals_stmts: list[tuple[ast.Global, Scope]] = []
        self.imports: list[tuple[ast.alias, Scope]] = []  # `from m import name` (any scope)
        for stmt in tree.body:
            self._visit(stmt, self.module)

    # binding helpers
    def _bind(self, scope: Scope, name: str) -> None:
        scope.bound.add(name)

    def _visit_args(self, args: ast.arguments, outer: Scope, inner: Scope) -> None:
        for default in [*args.defaults, *(d for d in args.kw_defaults if d is not None)]:
            self._visit(default, outer)
        every = [*args.posonlyargs, *args.args, *args.kwonlyargs]
        every += [a for a in (args.vararg, args.kwarg) if a is not None]
        for a in every:
            self._bind(inner, a.arg)
            if a.annotation is not None:
                self._visit_annotation(a.annotation, outer)

    def _visit_annotation(self, node: ast.expr, scope: Scope) -> None:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                self.annotations.append((sub, scope))
        self._visit(node, scope)

    def _visit(self, node: ast.AST, scope: Scope) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for d in node.decorator_list:
                self._visit(d, scope)
            inner = Scope("function", scope)
            self._visit_args(node.args, scope, inner)
            if node.returns is not None:
                self._visit_annotation(node.returns, scope)
            self._bind(scope, node.name)
            self.defs.append((node, scope))
            for stmt in node.body:
                self._visit(stmt, inner)
        elif isinstance(node, ast.Lambda):
            inner = Scope("function", scope)
            self._visit_args(node.args, scope, inner)
            self._visit(node.body, inner)
        elif isinstance(node, ast.ClassDef):
            for sub in [*node.decorator_list, *node.bases, *(k.value for k in node.keywords)]:
                self._visit(sub, scope)
            self._bind(scope, node.name)
            self.defs.append((node, scope))
            inner = Scope("class", scope)
            for stmt in node.body:
                self._visit(stmt, inner)
        elif isinstance(node, _COMPREHENSIONS):
            inner = Scope("comprehension", scope)
            for i, gen in enumerate(node.generators):
                self._visit(gen.iter, scope if i == 0 else inner)
                self._visit(gen.target, inner)
                for cond in gen.ifs:
                    self._visit(cond, inner)
            parts = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
            for part in parts:
                self._visit(part, inner)
        elif isinstance(node, ast.Name):
            self.names.append((node, scope))
            if isinstance(node.ctx, ast.Load):
                scope.loads.add(node.id)
            else:
                self._bind(scope, node.id)
        elif isinstance(node, ast.NamedExpr):
            self._visit(node.value, scope)
            target = node.target
            self.names.append((target, scope.binding_scope()))
            self._bind(scope.binding_scope(), target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                if alias.name != "*":
                    self._bind(scope, alias.asname or alias.name.split(".")[0])
                    self.imports.append((alias, scope))
        elif isinstance(node, ast.Global):
            scope.globals.update(node.names)
            self.globals_stmts.append((node, scope))
        elif isinstance(node, ast.Nonlocal):
            scope.nonlocals.update(node.names)
        elif isinstance(node, (ast.ExceptHandler, ast.MatchAs | ast.MatchStar)):
            if node.name:
                self._bind(scope, node.name)
            for child in ast.iter_child_nodes(node):
                self._visit(child, scope)
        elif isinstance(node, ast.MatchMapping):
            if node.rest:
                self._bind(scope, node.rest)
            for child in ast.iter_child_nodes(node):
                self._visit(child, scope)
        elif isinstance(node, ast.AnnAssign):
            self._visit(node.target, scope)
            self._visit_annotation(node.annotation, scope)
            if node.value is not None:
                self._visit(node.value, scope)
        else:
            for child in ast.iter_child_nodes(node):
                self._visit(child, scope)

    def resolve(self, name: str, scope: Scope) -> Scope | None:
        """The scope whose binding `name` read or bound in `scope` is; None when a class
        body both binds and reads it (Python would look in the class first, then in the
        module: no position can be renamed safely)."""
        current = scope
        first = True
        while current.kind != "module" and current.parent is not None:
            if name in current.globals:
                return self.module
            if current.kind == "class":
                if first and name in current.bound:
                    return None if name in current.loads else current
            elif name in current.bound and name not in current.nonlocals:
                return current
            first = False
            current = current.parent
        return self.module

    def is_module_level(self, name: str, scope: Scope) -> bool | None:
        """Whether `name` read or bound in `scope` is the module-level binding (None: see resolve)."""
        found = self.resolve(name, scope)
        return None if found is None else found is self.module
