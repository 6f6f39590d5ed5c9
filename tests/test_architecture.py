"""The package's import graph (issue #19): read with ``ast``, nothing imported.

* no cycle among the modules of ``jaxbnp``;
* no module imports another module's private (``_name``, not dunder) name,
  nor reads one as ``module._name``;
* layering: ``jaxbnp.models`` imports neither ``jaxbnp.inference`` nor the
  drivers (``jaxbnp.estimators``, ``jaxbnp.cli``); ``jaxbnp.inference`` does
  not import the drivers;
* the package's files cite the repository's own pages (docs/), never
  MATH.md or ARCHITECTURE.md;
* every jaxbnp module imported exists;
* no library file over ``MAX_FILE_LINES`` (1,000) lines;
* every sampler's module gives the one shape (``algorithm``);
* no module-level mutable state in ``jaxbnp.inference`` beyond the caches of compiled
  programs;
* a kernel batches its chains only through ``base.run_chains`` (and only it and the
  runner decide on the backend);
* ``[project] dependencies`` are what the package imports at import time (an
  import inside a function, or one guarded by ``except ImportError``, may come
  from an extra).

Every import counts, those inside functions included; ``from pkg import name``
counts as an import of ``pkg.name`` when that is a module, else of ``pkg``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "jaxbnp"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted((ROOT / PACKAGE).rglob("*.py"))}


def _is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _resolve(module: str, node: ast.ImportFrom) -> str:
    """The absolute name of the module a ``from ... import`` reads from."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not _is_package(module):
        base = base[:-1]
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _owner(name: str) -> str | None:
    """The longest jaxbnp module that ``name`` (a dotted module path) is, or lies in."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in MODULES:
            return candidate
        parts.pop()
    return None


def _imported_module_names(module: str):
    """``(dotted name, line)`` of every module that ``module`` imports or imports from."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"), filename=str(MODULES[module]))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            yield _resolve(module, node), node.lineno


def _imports(module: str):
    """``(imported module, private names imported from it, line)`` for each jaxbnp import."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"), filename=str(MODULES[module]))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _owner(alias.name)
                if target is not None:
                    yield target, [], node.lineno
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, node)
            if _owner(source) is None:
                continue
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in MODULES:
                    yield submodule, [], node.lineno
                else:
                    private = [alias.name] if _is_private(alias.name) else []
                    yield _owner(source), private, node.lineno


def _private_attributes(module: str):
    """``(module, name, line)`` for each ``alias._name`` where ``alias`` is a jaxbnp module imported here."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"), filename=str(MODULES[module]))
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name in MODULES:
                    aliases[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, node)
            for alias in node.names:
                if f"{source}.{alias.name}" in MODULES:
                    aliases[alias.asname or alias.name] = f"{source}.{alias.name}"
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and _is_private(node.attr)):
            yield aliases[node.value.id], node.attr, node.lineno


def _graph():
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    private: list[str] = []
    for module in MODULES:
        for target, names, line in _imports(module):
            if target != module:
                edges[module].add(target)
            for name in names:
                if target != module:
                    private.append(f"{module}:{line} imports {target}.{name}")
        for target, name, line in _private_attributes(module):
            if target != module:
                private.append(f"{module}:{line} uses {target}.{name}")
    return edges, private


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per back edge found by a depth-first search."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = dict.fromkeys(edges, WHITE)
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        colour[node] = GREY
        stack.append(node)
        for succ in sorted(edges[node]):
            if colour[succ] == GREY:
                found.append(stack[stack.index(succ):] + [succ])
            elif colour[succ] == WHITE:
                visit(succ)
        stack.pop()
        colour[node] = BLACK

    for node in sorted(edges):
        if colour[node] == WHITE:
            visit(node)
    return found


def _is_under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_modules_found():
    assert f"{PACKAGE}.models" in MODULES and f"{PACKAGE}.inference" in MODULES


def test_the_checks_see_what_they_look_for():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    assert _is_private("_x") and not _is_private("__all__") and not _is_private("x")
    inner = ast.parse("from ..models.ddt import to_linkage").body[0]
    assert _resolve(f"{PACKAGE}.inference.trees.mcmc", inner) == f"{PACKAGE}.inference.models.ddt"
    assert _resolve(f"{PACKAGE}.inference", ast.parse("from ..models import ddt").body[0]) == f"{PACKAGE}.models"


def test_imported_modules_exist():
    missing = [
        f"{module}:{line} imports {name}"
        for module in MODULES
        for name, line in _imported_module_names(module)
        if _is_under(name, PACKAGE) and name not in MODULES
    ]
    assert not missing, "imports of modules that do not exist:\n" + "\n".join(missing)


MAX_FILE_LINES = 1000  # issue #39: no library file over a thousand lines


def _long_files(modules: dict, limit: int) -> list[str]:
    return [f"{path.relative_to(ROOT)}: {n} lines"
            for path in modules.values()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > limit]


def test_no_library_file_over_a_thousand_lines():
    assert _long_files({"this file": Path(__file__)}, 10), "the check sees a long file"
    long = _long_files(MODULES, MAX_FILE_LINES)
    assert not long, "split these files:\n" + "\n".join(long)


#: every sampler's module and the function that gives its one shape (issue #39;
#: ``jaxbnp.inference.base.SamplingAlgorithm``, run in tests/test_algorithms.py)
SAMPLER_MODULES = (
    "jaxbnp.inference.partition.moves",
    "jaxbnp.inference.partition.auxiliary",
    "jaxbnp.inference.partition.slice_gibbs",
    "jaxbnp.inference.partition.subcluster",
    "jaxbnp.inference.trees.mcmc",
    "jaxbnp.inference.trees.population",
    "jaxbnp.inference.bhmc.sweep",
    "jaxbnp.inference.sharded",
)


def _top_level_functions(module: str) -> set:
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}


def test_every_sampler_module_gives_the_one_shape():
    for module in SAMPLER_MODULES:
        assert "algorithm" in _top_level_functions(module), f"{module} has no algorithm(...)"
    # the check sees a module without one
    assert "algorithm" not in _top_level_functions("jaxbnp.inference.partition.gibbs")


#: module-level state allowed in jaxbnp.inference: caches of compiled programs (tgMCMC's host
#: trees live in a store its kernel owns, ``tgmcmc.host.HostTrees``)
_ALLOWED_STATE = {
    "jaxbnp.inference.runner": {"_PROGRAMS", "_COMPILED"},
}
_MUTABLE_CALLS = ("dict", "list", "set", "OrderedDict", "defaultdict", "deque", "Lock", "RLock",
                  "count", "local", "WeakKeyDictionary", "WeakValueDictionary")


def _module_state(source: str) -> set:
    """Names a module binds at its top level to a mutable container, a lock or a counter,
    except ``__all__`` and public UPPER_CASE constant tables."""
    found = set()
    for node in ast.parse(source).body:
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
            continue
        value = node.value
        mutable = isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp))
        if isinstance(value, ast.Call):
            mutable = ast.unparse(value.func).split(".")[-1] in _MUTABLE_CALLS
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            name = ast.unparse(target)
            constant = name.isupper() and not name.startswith("_")
            if mutable and name != "__all__" and not constant:
                found.add(name)
    return found


def test_no_module_level_mutable_state_in_inference():
    assert _module_state("import threading\n_STORE = {}\n_LOCK = threading.Lock()\nTABLE = {}\n") == \
        {"_STORE", "_LOCK"}, "the check sees state"
    for module in MODULES:
        if module.startswith("jaxbnp.inference"):
            state = _module_state(MODULES[module].read_text(encoding="utf-8"))
            extra = state - _ALLOWED_STATE.get(module, set())
            assert not extra, f"{module} keeps module-level state {sorted(extra)}: put it in the state"


_BATCHING_CALLS = {"vmap", "pmap", "map"}


def _kernel_batching(source: str) -> list[str]:
    """Calls of ``vmap``, ``pmap`` or ``lax.map`` inside the methods of a NumPyro kernel class
    (one that defines ``init`` and ``sample``), and decisions on ``jax.default_backend()``
    anywhere: ``"Class.method: call"`` for each."""
    found = []
    tree = ast.parse(source)
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        methods = {f.name for f in cls.body if isinstance(f, ast.FunctionDef)}
        if not {"init", "sample"} <= methods:
            continue
        for node in ast.walk(cls):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            owner = getattr(func.value, "id", getattr(func.value, "attr", "")) if isinstance(func, ast.Attribute) else ""
            if name in ("vmap", "pmap") or (name == "map" and owner == "lax"):
                found.append(f"{cls.name}: {name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "default_backend":
            found.append("default_backend()")
    return found


def test_only_run_chains_and_the_runner_batch_chains():
    """A kernel batches NumPyro's vectorized chains only through ``base.run_chains``, and only
    ``base.run_chains`` and the runner decide on the backend."""
    planted = ("import jax\nfrom jax import lax\nclass K:\n    def init(self): return jax.vmap(f)(x)\n"
               "    def sample(self): return lax.map(f, x)\n"
               "def auto(): return jax.default_backend()\n")
    assert sorted(_kernel_batching(planted)) == ["K: map", "K: vmap", "default_backend()"], \
        "the check sees it"
    allowed = {"jaxbnp.inference.base", "jaxbnp.inference.runner"}
    for module in MODULES:
        if module.startswith("jaxbnp.inference") and module not in allowed:
            found = _kernel_batching(MODULES[module].read_text(encoding="utf-8"))
            assert not found, f"{module} batches chains itself: {found}; use base.run_chains"


def test_no_import_cycle():
    edges, _ = _graph()
    cycles = _cycles(edges)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_private_name_imported_from_another_module():
    _, private = _graph()
    assert not private, "private names imported across modules:\n" + "\n".join(private)


LAYERS = {  # a module under the key must not import a module under any of the values
    f"{PACKAGE}.models": (f"{PACKAGE}.inference", f"{PACKAGE}.estimators", f"{PACKAGE}.cli"),
    f"{PACKAGE}.inference": (f"{PACKAGE}.estimators", f"{PACKAGE}.cli"),
}


def test_layering():
    edges, _ = _graph()
    upward = [
        f"{module} -> {target}"
        for module, targets in sorted(edges.items())
        for target in sorted(targets)
        for lower, uppers in LAYERS.items()
        if _is_under(module, lower) and any(_is_under(target, u) for u in uppers)
    ]
    assert not upward, "imports upward:\n" + "\n".join(upward)


def test_no_reference_to_files_outside_the_repository():
    bad = [
        f"{path.relative_to(ROOT)}:{i}: {line.strip()}"
        for path in MODULES.values()
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if "MATH.md" in line or "ARCHITECTURE.md" in line
    ]
    assert not bad, "cite docs/mathematics.md or docs/design.md instead:\n" + "\n".join(bad)


def test_docs_hold_no_control_characters():
    """A LaTeX escape written through a non-raw Python string (``"\\frac"`` as ``"\\f" + "rac"``)
    leaves a control character in the page; it happened once to docs/mathematics.md."""
    import re

    pages = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
    bad = [
        f"{path.relative_to(ROOT)}:{i}"
        for path in pages
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if re.search(r"[\x00-\x08\x0b\x0c\x0e-\x1f]", line)
    ]
    assert len(pages) > 5 and not bad, "control characters in:\n" + "\n".join(bad)


# ----------------------------------------------------------------------------- dependencies
def _third_party_imports(top_level_only: bool) -> dict[str, list[str]]:
    """``{top-level package: [where]}`` of the non-stdlib, non-jaxbnp imports.

    ``top_level_only``: only the imports that must succeed when the module is
    imported (not those inside a function, a method, an ``if TYPE_CHECKING:``
    block or a ``try`` that catches ``ImportError``).
    """
    import sys

    found: dict[str, list[str]] = {}

    def visit(node: ast.AST, module: str, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            child_lazy = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) or (
                isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test)
            ) or (  # try: import x / except ImportError: an optional import
                isinstance(child, ast.Try)
                and any(h.type is not None and "ImportError" in ast.unparse(h.type) for h in child.handlers)
            )
            names = []
            if isinstance(child, ast.Import):
                names = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                names = [child.module]
            for name in names:
                top = name.split(".")[0]
                if top != PACKAGE and top not in sys.stdlib_module_names and not (top_level_only and lazy):
                    found.setdefault(top, []).append(f"{module}:{child.lineno}")
            visit(child, module, child_lazy)

    for module, path in MODULES.items():
        visit(ast.parse(path.read_text(encoding="utf-8")), module, False)
    return found


def _dependencies() -> tuple[set[str], set[str]]:
    """(names in [project] dependencies, names in any optional-dependencies extra)."""
    import re
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]

    def names(specs):
        return {re.split(r"[<>=!~\[; ]", spec, maxsplit=1)[0].strip().lower() for spec in specs}

    extras = set().union(*(names(v) for v in project.get("optional-dependencies", {}).values()))
    return names(project["dependencies"]), extras


#: import name -> distribution name where they differ
DISTRIBUTIONS = {"sklearn": "scikit-learn"}


def test_runtime_dependencies_are_the_imports():
    required, extras = _dependencies()
    at_import = _third_party_imports(top_level_only=True)
    anywhere = _third_party_imports(top_level_only=False)
    undeclared = [
        f"{name} ({', '.join(where)})" for name, where in sorted(at_import.items())
        if DISTRIBUTIONS.get(name, name) not in required
    ]
    assert not undeclared, "imported when jaxbnp is imported but not in [project] dependencies:\n" + "\n".join(
        undeclared)
    unknown = [
        f"{name} ({', '.join(where)})" for name, where in sorted(anywhere.items())
        if DISTRIBUTIONS.get(name, name) not in required | extras
    ]
    assert not unknown, "imported but in neither the dependencies nor an extra:\n" + "\n".join(unknown)
    unused = sorted(required - {DISTRIBUTIONS.get(n, n) for n in anywhere} - {"jaxlib"})
    assert not unused, f"[project] dependencies that jaxbnp never imports: {unused}"
