"""The package's shape: the layer contract, modules of one job, the option list in one place.

The layer contract: every import (at the top, in a function, or under ``if
TYPE_CHECKING:``) goes down :data:`LAYERS` or stays in its layer, and no
module imports one that imports it back. What does not hold yet is named with
its reason in a register (:data:`KNOWN_CYCLES`, :data:`KNOWN_UPWARD`,
:data:`LAZY_IMPORTS`, :data:`LONG_MODULES`), printed after every run of the
unit tier; the registers are meant to be empty, and an entry that no longer
names anything fails.
"""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import celery_redlock
from celery_redlock import LockedTask
from celery_redlock.demo.__main__ import parse_options
from celery_redlock.tasks.options import OPTION_NAMES

PACKAGE = Path(celery_redlock.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Package modules ``path`` imports: at the top, in a function, or for the type checker.

    An import under ``if TYPE_CHECKING:`` is still one a reader and mypy follow.
    """
    tree = ast.parse(path.read_text())
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join([*base, *([node.module] if node.module else [])])
            found.add(target)
            # ``from . import signals`` imports a module, not a name.
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return {name for name in found if name.startswith("celery_redlock")}


def import_graph() -> dict[str, set[str]]:
    """Each module's imports of the others (``from .. import x`` names ``x``, not the face)."""
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    return {
        name: {
            target
            for target in imports(path)
            if target in modules and target not in (name, "celery_redlock")
        }
        for name, path in modules.items()
    }


#: The layers, lowest first: a module imports from its own layer or from a
#: lower tier. Layers in one tier are peers and import nothing from each other.
#: A module is in the layer of its longest prefix here (relative to the package).
LAYERS: tuple[dict[str, tuple[str, ...]], ...] = (
    {"base": ("errors", "signals", "_clock", "_layout", "_scripts", "_validators")},
    {"transport": ("transport",)},
    {"lock": ("lock",), "ratelimit": ("ratelimit",)},
    {"tasks core": ("tasks",)},
    {"tasks/features": ("tasks.features",)},
    {"tasks pipelines": ("tasks.run", "tasks.publish")},
    {"locked_task": ("tasks.locked_task",)},
    {"app wiring": ("tasks.app_setup", "tasks.task_table", "tasks.cleanup_request")},
    {"admin": ("admin",), "testing": ("testing",), "contrib": ("contrib",)},
    {"cli": ("cli",)},
    {"demo": ("demo",)},
    {"face": ("", "config", "testconf", "pytest_plugin")},
)


def layer_of(module: str) -> tuple[int, str]:
    """The tier and the layer of ``module``."""
    relative = module.removeprefix("celery_redlock").removeprefix(".")
    found = [
        (len(prefix), tier, layer)
        for tier, layers in enumerate(LAYERS)
        for layer, prefixes in layers.items()
        for prefix in prefixes
        if relative == prefix or (prefix and relative.startswith(f"{prefix}."))
    ]
    assert found, f"{module} is in no layer: add it to LAYERS"
    _, tier, layer = max(found)
    return tier, layer


def upward_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """``(module, target)`` for each import of a higher tier or of a peer layer."""
    found = set()
    for name, targets in graph.items():
        tier, layer = layer_of(name)
        for target in targets:
            target_tier, target_layer = layer_of(target)
            if target_tier > tier or (target_tier == tier and target_layer != layer):
                found.add((name, target))
    return found


def cycle_groups(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The groups of modules that import each other, directly or round a loop."""

    def reached(start: str) -> set[str]:
        seen: set[str] = set()
        todo = [start]
        while todo:
            new = graph[todo.pop()] - seen
            seen |= new
            todo.extend(new)
        return seen

    reach = {name: reached(name) for name in graph}
    return {
        frozenset({name, *(other for other in reach[name] if name in reach[other])})
        for name in graph
        if name in reach[name]
    }


#: Import cycles still in the package, each a group of modules with the reason
#: it is there. A cycle outside every group fails; so does a group with no cycle
#: left in it: take it out of the register when its cycle is broken.
KNOWN_CYCLES: dict[frozenset[str], str] = {}

#: Imports against the layer order still in the package, each with its reason.
KNOWN_UPWARD: dict[tuple[str, str], str] = {}


def test_no_cycle_outside_the_register_and_no_stale_entry() -> None:
    found = cycle_groups(import_graph())
    assert [sorted(group) for group in found if not any(group <= k for k in KNOWN_CYCLES)] == []
    assert [sorted(k) for k in KNOWN_CYCLES if not any(group <= k for group in found)] == []


def test_every_import_goes_down_the_layers_or_is_registered() -> None:
    assert upward_imports(import_graph()) == set(KNOWN_UPWARD)


def test_every_module_is_in_a_layer() -> None:
    for name in import_graph():
        layer_of(name)


def test_the_contract_checks_find_what_breaks_it() -> None:
    assert cycle_groups({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {frozenset("abc")}
    assert cycle_groups({"a": {"b"}, "b": set()}) == set()
    graph = {
        "celery_redlock.lock.lock": {"celery_redlock.ratelimit.limiter", "celery_redlock.errors"},
        "celery_redlock.ratelimit.limiter": set(),
        "celery_redlock.errors": set(),
        "celery_redlock.tasks.options": {"celery_redlock.tasks.features.debounce"},
        "celery_redlock.tasks.features.debounce": {"celery_redlock.tasks.options"},
    }
    assert upward_imports(graph) == {
        ("celery_redlock.lock.lock", "celery_redlock.ratelimit.limiter"),
        ("celery_redlock.tasks.options", "celery_redlock.tasks.features.debounce"),
    }


def registered_exceptions() -> list[str]:
    """What the layer contract lets pass today, one line each (shown after the unit tier)."""
    return [
        *(f"cycle {' <-> '.join(sorted(k))}: {why}" for k, why in KNOWN_CYCLES.items()),
        *(f"upward {source} -> {target}: {why}" for (source, target), why in KNOWN_UPWARD.items()),
        *(f"lazy {source} -> {target}: {why}" for (source, target), why in LAZY_IMPORTS.items()),
        *(f"long {name}: {why}" for name, why in LONG_MODULES.items()),
    ]


#: Package imports made inside a function rather than at the top of a module,
#: and why. The cycle test above counts them too, so none of them may break a
#: cycle by hiding it from the top of the module: a new one is a decision.
LAZY_IMPORTS: dict[tuple[str, str], str] = {}


def lazy_imports() -> set[tuple[str, str]]:
    """``(module, package module)`` for each package import inside a function or method."""
    found: set[tuple[str, str]] = set()
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        package = module_name(path).split(".")
        if path.name != "__init__.py":
            package = package[:-1]
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.Import):
                    targets = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom):
                    base = package[: len(package) - node.level + 1] if node.level else []
                    targets = [".".join([*base, *([node.module] if node.module else [])])]
                else:
                    continue
                found.update(
                    (module_name(path), target)
                    for target in targets
                    if target.startswith("celery_redlock")
                )
    return found


def test_every_import_inside_a_function_is_listed_with_its_reason() -> None:
    assert lazy_imports() == set(LAZY_IMPORTS)


#: Modules over :data:`LONG` lines, each with the one job that makes it long.
#: A module that grows past the limit is split by job, or listed here.
LONG = 400
LONG_MODULES = {}


def line_counts() -> dict[str, int]:
    return {module_name(path): len(path.read_text().splitlines()) for path in PACKAGE.rglob("*.py")}


def test_every_module_over_the_limit_is_listed_with_its_one_job() -> None:
    long = {name for name, lines in line_counts().items() if lines > LONG}
    assert long == set(LONG_MODULES), {name: line_counts()[name] for name in long}


def test_the_fast_tier_starts_no_server_and_no_worker() -> None:
    # tests/unit/conftest.py makes the fixtures that start servers fail; a
    # unit test could still start one through the harness or a worker module.
    unit = Path(__file__).parent
    starters = ("celery_redlock.testing", "tests.support", "tests.worker.support", "subprocess")
    found = {
        (path.name, name)
        for path in unit.rglob("*.py")
        for name in runtime_imports_of(path)
        if name.startswith(starters)
    }
    # It runs `python -c "<import line>"` in fresh interpreters: no server, no worker.
    assert found == {("test_import_weight.py", "subprocess")}


def test_the_unit_tier_mirrors_the_package_folders() -> None:
    unit = Path(__file__).parent
    folders = {path.parent.relative_to(unit) for path in unit.rglob("test_*.py")} - {Path()}
    assert folders
    assert sorted(str(folder) for folder in folders if not (PACKAGE / folder).is_dir()) == []


def runtime_imports_of(path: Path) -> set[str]:
    """Every module a test file imports, by absolute name."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_every_script_cites_the_module_that_owns_the_key_layout() -> None:
    scripts = sorted((PACKAGE / "scripts").glob("*.lua"))
    assert scripts
    assert [path.name for path in scripts if "_layout" not in path.read_text()] == []


def test_locked_task_declares_every_option_and_only_those() -> None:
    declared = {
        name
        for name, value in vars(LockedTask).items()
        if not name.startswith("_") and name in LockedTask.__annotations__ and not callable(value)
    }
    assert declared == set(OPTION_NAMES)


def test_the_readmes_demo_command_line_is_the_demos() -> None:
    readme = (PACKAGE.parent / "README.md").read_text()
    (line,) = re.findall(r"`\./dev demo (--nodes[^`]*)`", readme)
    words = [
        {"URL": "redis://h:1/0", "[URL...]": "redis://h:2/0"}.get(word, word)
        for word in shlex.split(line)
    ]
    options = parse_options(words)
    assert options.nodes == ["redis://h:1/0", "redis://h:2/0"]
    assert (options.broker, options.witness) == ("redis://h:1/0", "redis://h:1/0")
    assert "witness database is flushed" in readme
