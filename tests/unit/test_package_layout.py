"""The package's shape: no import cycles, modules of one job, the option list in one place."""

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


def runtime_imports(path: Path) -> set[str]:
    """Package modules ``path`` imports at run time (anywhere, not only at the top).

    Imports under ``if TYPE_CHECKING:`` are for the type checker only.
    """
    tree = ast.parse(path.read_text())
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    typing_only = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for statement in block.body
        for node in ast.walk(statement)
    }
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
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
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    return {
        name: {target for target in runtime_imports(path) if target in modules and target != name}
        for name, path in modules.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(name: str) -> None:
        state[name] = 1
        path.append(name)
        for target in sorted(graph[name]):
            if state.get(target) == 1:
                found.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)
    return found


def test_no_module_imports_one_that_imports_it_back() -> None:
    graph = import_graph()
    # Parents import their submodules' names, and a submodule imports its
    # package's siblings: the package __init__ files are the public surface,
    # not part of the layering.
    layered = {
        name: {target for target in targets if target not in ("celery_redlock",)}
        for name, targets in graph.items()
        if name != "celery_redlock"
    }
    assert cycles(layered) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


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
LONG_MODULES = {
}


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
        for path in unit.glob("*.py")
        for name in runtime_imports_of(path)
        if name.startswith(starters)
    }
    # It runs `python -c "<import line>"` in fresh interpreters: no server, no worker.
    assert found == {("test_import_weight.py", "subprocess")}


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
