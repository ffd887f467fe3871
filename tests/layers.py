"""The import checker behind tests/system/test_layers.py: plain functions over ``ast``, no imports.

The rules (rank table, pure modules, allowed lazy imports) are data in
:class:`Rules`, filled in by tests/system/test_layers.py from the plan of issue 22; this module only
reads a package's source files and reports where they break those rules. Nothing here imports
the package it checks, so a module that pulls in a database driver or a Temporal client costs
nothing, and a fake package tree written to a temporary folder is checked the same way (that is
how the checker itself is tested).

What an import means here is what it does at run time:

* ``import a.b.c`` and ``from a.b.c import x`` run ``a/__init__.py`` and ``a/b/__init__.py``
  before ``c``: the packages on the way are edges too (except the importer's own packages,
  which already ran before the importer did), so a package ``__init__`` that re-exports from a
  module with a database driver makes every sibling impure;
* ``from a.b import c`` is an edge to the module ``a.b.c`` when there is one, else to ``a.b``;
* relative imports are resolved against the importer's package;
* an import in a function body runs when the function is called: it is reported as a
  function-local import, and still counts for ranks and for what a pure module pulls in;
* an import under ``if TYPE_CHECKING:`` never runs: it is reported, and counts for ranks only.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

MODULE = "module"  # a module-level import: runs when the module is imported
LOCAL = "local"  # inside a function body: runs when the function is called
TYPE_ONLY = "type_checking"  # under `if TYPE_CHECKING:`: never runs

UPWARD = "upward edge"
UNRANKED = "unranked module"
CYCLE = "import cycle"
FUNCTION_LOCAL = "function-local import"
TYPE_CHECKING_IMPORT = "TYPE_CHECKING import"
DYNAMIC = "dynamic import"
OUTSIDE = "import of code outside the package"
IMPURE = "impure import"


@dataclass(frozen=True)
class Rules:
    """What the checker enforces over one package.

    Attributes:
        package: the checked package's top-level name (``durable_sse``).
        ranks: dotted prefix -> rank; a module's rank is that of its longest matching prefix
            (matched by whole dotted components). The package root itself is ``root_rank``.
        root_rank: the rank of the package root (``durable_sse/__init__.py``), matched
            exactly, never as a prefix: a module missing from ``ranks`` is a failure, not
            rank ``root_rank``.
        import_ceiling: prefix -> the highest rank that prefix may import outside itself,
            where the plan asks for less than "any lower rank" (the demo source: rank 0 only).
        pure: prefixes of the modules that must not reach ``forbidden`` at run time.
        impure_exceptions: prefixes carved out of ``pure`` (the gap store).
        forbidden: top-level names of the libraries the pure modules must not import.
        outside: top-level names of code beside the package that may import it, never the
            other way round (workflows, activities, worker).
        allowed_lazy: (importer prefix, imported module) -> why this one function-local import
            is allowed; the importer prefix matches the module and its submodules.
    """

    package: str
    ranks: Mapping[str, int]
    root_rank: int
    import_ceiling: Mapping[str, int]
    pure: tuple[str, ...]
    impure_exceptions: tuple[str, ...]
    forbidden: frozenset[str]
    outside: frozenset[str]
    allowed_lazy: Mapping[tuple[str, str], str]


@dataclass(frozen=True)
class Import:
    """One imported module, as one import statement names it."""

    source: str  # the importing module
    target: str  # the imported module (absolute, dotted)
    line: int
    kind: str  # MODULE, LOCAL or TYPE_ONLY
    statement: str  # the statement's source text, for messages


@dataclass(frozen=True, order=True)
class Violation:
    file: str
    line: int
    rule: str
    detail: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.rule}: {self.detail}"


@dataclass
class Package:
    """A package's modules and the imports their source names."""

    files: dict[str, str] = field(default_factory=dict)  # module -> file, relative to root
    imports: list[Import] = field(default_factory=list)
    dynamic: list[tuple[str, int, str]] = field(default_factory=list)  # module, line, call


def within(name: str, prefix: str) -> bool:
    """Whether dotted ``name`` is ``prefix`` or inside it (whole components only)."""
    return name == prefix or name.startswith(prefix + ".")


def ancestors(name: str) -> list[str]:
    """``a.b.c`` -> ``["a", "a.b"]``: the packages that run before the module does."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


class _ImportVisitor(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool, modules: set[str]) -> None:
        self.module = module
        self.package = module if is_package else module.rpartition(".")[0]
        self.modules = modules
        self.functions = 0
        self.type_only = 0
        self.found: list[Import] = []
        self.dynamic: list[tuple[int, str]] = []

    def kind(self) -> str:
        if self.type_only:
            return TYPE_ONLY
        return LOCAL if self.functions else MODULE

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for decorator in node.decorator_list:  # decorators and defaults run at definition
            self.visit(decorator)
        self.visit(node.args)
        self.functions += 1
        for statement in node.body:
            self.visit(statement)
        self.functions -= 1

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self.visit(node.args)
        self.functions += 1
        self.visit(node.body)
        self.functions -= 1

    def visit_If(self, node: ast.If) -> None:
        self.visit(node.test)
        test = node.test
        negated = isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
        if isinstance(test, ast.UnaryOp) and negated:
            test = test.operand
        checking = is_type_checking(test)
        for branch, never_runs in (
            (node.body, checking and not negated),
            (node.orelse, checking and negated),
        ):
            self.type_only += 1 if never_runs else 0
            for statement in branch:
                self.visit(statement)
            self.type_only -= 1 if never_runs else 0

    def add(self, node: ast.stmt, target: str) -> None:
        self.found.append(Import(self.module, target, node.lineno, self.kind(), ast.unparse(node)))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.add(node, alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base_parts = self.package.split(".")
            base_parts = base_parts[: len(base_parts) - (node.level - 1)]
            base = ".".join(base_parts + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            self.add(node, submodule if submodule in self.modules else base)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name in ("import_module", "__import__"):
            self.dynamic.append((node.lineno, ast.unparse(node)))
        self.generic_visit(node)


def read_package(root: Path, package: str) -> Package:
    """Parse every ``.py`` file under ``root/package`` (``root`` is the folder holding it)."""
    paths = sorted((root / package).rglob("*.py"))
    result = Package()
    for path in paths:
        result.files[module_name(root, path)] = path.relative_to(root).as_posix()
    modules = set(result.files)
    for path in paths:
        module = module_name(root, path)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=result.files[module])
        visitor = _ImportVisitor(module, path.name == "__init__.py", modules)
        visitor.visit(tree)
        result.imports.extend(visitor.found)
        result.dynamic.extend((module, line, call) for line, call in visitor.dynamic)
    return result


def rank_of(name: str, rules: Rules) -> int | None:
    if name == rules.package:
        return rules.root_rank
    matches = [prefix for prefix in rules.ranks if within(name, prefix)]
    return rules.ranks[max(matches, key=len)] if matches else None


def entry_of(name: str, rules: Rules) -> str | None:
    """The rank table's entry a module belongs to (its longest matching prefix)."""
    matches = [prefix for prefix in rules.ranks if within(name, prefix)]
    return max(matches, key=len) if matches else None


def internal(name: str, rules: Rules) -> bool:
    return within(name, rules.package)


def top_level(name: str) -> str:
    return name.partition(".")[0]


def lazy_reason(item: Import, rules: Rules) -> str | None:
    for (importer, imported), reason in rules.allowed_lazy.items():
        if within(item.source, importer) and item.target == imported and item.kind == LOCAL:
            return reason
    return None


def runtime_targets(item: Import, package: Package, rules: Rules) -> list[str]:
    """The package's modules an import runs: its target and the packages on the way there."""
    if not internal(item.target, rules):
        return []
    own = set(ancestors(item.source))
    on_the_way = [p for p in ancestors(item.target) if p in package.files and p not in own]
    target = [item.target] if item.target in package.files else []
    return [m for m in on_the_way + target if m != item.source]


def check_ranks(package: Package, rules: Rules) -> Iterator[Violation]:
    for module, file in package.files.items():
        if rank_of(module, rules) is None:
            yield Violation(
                file, 1, UNRANKED, f"{module} is in no entry of the rank table: give it a rank"
            )
    for item in package.imports:
        if not internal(item.target, rules) or item.target == item.source:
            continue
        source_rank, target_rank = rank_of(item.source, rules), rank_of(item.target, rules)
        if source_rank is None or target_rank is None:
            continue  # reported once, on the unranked module itself
        file = package.files[item.source]
        if entry_of(item.source, rules) == entry_of(item.target, rules):
            continue  # a package may import itself
        if target_rank > source_rank:
            yield Violation(
                file,
                item.line,
                UPWARD,
                f"{item.source} (rank {source_rank}) imports {item.target} (rank {target_rank})"
                f": `{item.statement}`",
            )
            continue
        for prefix, ceiling in rules.import_ceiling.items():
            if within(item.source, prefix) and target_rank > ceiling:
                yield Violation(
                    file,
                    item.line,
                    UPWARD,
                    f"{item.source} may import only rank {ceiling} outside itself, and imports"
                    f" {item.target} (rank {target_rank}): `{item.statement}`",
                )


def check_import_places(package: Package, rules: Rules) -> Iterator[Violation]:
    """Function-local, TYPE_CHECKING and dynamic imports; imports of the code outside."""
    for item in package.imports:
        file = package.files[item.source]
        allowed = lazy_reason(item, rules) is not None
        if item.kind == LOCAL and not allowed:
            yield Violation(
                file,
                item.line,
                FUNCTION_LOCAL,
                f"`{item.statement}` in a function of {item.source}: import at module level"
                " (a lazy import that dodges a cycle or a layer hides it)",
            )
        elif item.kind == TYPE_ONLY:
            yield Violation(
                file,
                item.line,
                TYPE_CHECKING_IMPORT,
                f"`{item.statement}` under `if TYPE_CHECKING:` in {item.source}: import at"
                " module level, or move the type down a layer",
            )
        if top_level(item.target) in rules.outside and not allowed:
            yield Violation(
                file,
                item.line,
                OUTSIDE,
                f"{item.source} imports {item.target}, which is outside the package and may"
                f" import it, never the other way round: `{item.statement}`",
            )
    for module, line, call in package.dynamic:
        yield Violation(
            package.files[module],
            line,
            DYNAMIC,
            f"`{call}` in {module} hides an import from this check",
        )


def _graph(package: Package, rules: Rules, kinds: Iterable[str]) -> dict[str, list[Import]]:
    """module -> the imports (one per runtime target) its ``kinds`` of statements run."""
    wanted = set(kinds)
    graph: dict[str, list[Import]] = {module: [] for module in package.files}
    for item in package.imports:
        if item.kind in wanted:
            for target in runtime_targets(item, package, rules):
                graph[item.source].append(
                    Import(item.source, target, item.line, item.kind, item.statement)
                )
    return graph


def _strongly_connected(graph: Mapping[str, list[Import]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; components in a stable order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, int]] = [(start, 0)]
        while work:
            node, position = work.pop()
            if position == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            edges = graph[node]
            if position < len(edges):
                work.append((node, position + 1))
                target = edges[position].target
                if target not in index:
                    work.append((target, 0))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return sorted(components)


def _path(
    graph: Mapping[str, list[Import]], start: str, goal: str, allowed: set[str]
) -> list[Import]:
    """The shortest chain of imports from ``start`` to ``goal`` through ``allowed`` modules."""
    came: dict[str, Import] = {}
    queue = deque([start])
    seen = {start}
    while queue:
        node = queue.popleft()
        for edge in graph[node]:
            if edge.target == goal:
                chain = [edge]
                while chain[0].source != start:
                    chain.insert(0, came[chain[0].source])
                return chain
            if edge.target in allowed and edge.target not in seen:
                seen.add(edge.target)
                came[edge.target] = edge
                queue.append(edge.target)
    return []


def hops(chain: list[Import], package: Package) -> str:
    """``a (a.py:3) -> b (b.py:7) -> `` for a chain of imports; a package that runs because
    a module inside it is imported (line 0) is said so."""
    return "".join(
        f"{edge.source} ({package.files[edge.source]}:{edge.line}) -> "
        if edge.line
        else f"{edge.source} (inside package) -> "
        for edge in chain
    )


def check_cycles(package: Package, rules: Rules) -> Iterator[Violation]:
    graph = _graph(package, rules, [MODULE])
    for component in _strongly_connected(graph):
        if len(component) < 2:
            continue
        members = set(component)
        chain = _path(graph, component[0], component[0], members)
        yield Violation(
            package.files[component[0]],
            chain[0].line,
            CYCLE,
            f"{len(component)} modules import each other at module level: "
            f"{', '.join(component)}; one cycle: {hops(chain, package)}{component[0]}",
        )


def is_pure(module: str, rules: Rules) -> bool:
    pure = module == rules.package or any(within(module, prefix) for prefix in rules.pure)
    return pure and not any(within(module, prefix) for prefix in rules.impure_exceptions)


def check_purity(package: Package, rules: Rules) -> Iterator[Violation]:
    """A pure module reaches none of ``rules.forbidden`` at run time, through any module."""
    graph = _graph(package, rules, [MODULE, LOCAL])
    for module in package.files:  # a module's own packages run before it
        for parent in ancestors(module):
            if parent in package.files:
                graph[module].append(Import(module, parent, 0, MODULE, f"(package {parent})"))
    direct: dict[str, list[Import]] = {module: [] for module in package.files}
    for item in package.imports:
        if item.kind != TYPE_ONLY and top_level(item.target) in rules.forbidden:
            direct[item.source].append(item)
    for module in sorted(package.files):
        if not is_pure(module, rules):
            continue
        came: dict[str, Import] = {}
        order = [module]
        seen = {module}
        queue = deque([module])
        while queue:
            node = queue.popleft()
            for edge in graph[node]:
                if edge.target not in seen:
                    seen.add(edge.target)
                    came[edge.target] = edge
                    order.append(edge.target)
                    queue.append(edge.target)
        reported: set[str] = set()
        for reached in order:  # breadth first: the shortest chain to each library
            for item in direct[reached]:
                library = top_level(item.target)
                if library in reported:
                    continue
                reported.add(library)
                chain: list[Import] = []
                node = reached
                while node != module:
                    chain.insert(0, came[node])
                    node = came[node].source
                yield Violation(
                    package.files[module],
                    (chain[0].line if chain else item.line) or 1,
                    IMPURE,
                    f"pure module {module} imports {library}: {hops(chain, package)}{reached}"
                    f" ({package.files[reached]}:{item.line}: `{item.statement}`)",
                )


def check(root: Path, rules: Rules) -> list[Violation]:
    """Every violation of ``rules`` by the package ``rules.package`` under ``root``."""
    package = read_package(root, rules.package)
    found = [
        *check_ranks(package, rules),
        *check_import_places(package, rules),
        *check_cycles(package, rules),
        *check_purity(package, rules),
    ]
    return sorted(set(found))
