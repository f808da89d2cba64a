"""The package's layers, read from its own import statements (every ``import`` and ``from …
import``, at module level or inside a function): no module imports itself back through a
cycle, and the math layers import nothing of the engine, the models, the studies, the
experiments, the figures or the command line."""

import ast
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[1] / "src" / "specbound"
MATH_LAYERS = ("checks", "probability", "statistics", "bounds", "drafts", "verifiers", "chains")
UPPER_LAYERS = ("engine", "models", "studies", "experiments", "plots", "api", "serve", "cli")


def module_name(path: Path) -> str:
    parts = ["specbound", *path.relative_to(SOURCE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the specbound modules it imports (a name imported from a package that is
    itself a submodule counts as that submodule)."""
    modules = {module_name(path): path for path in SOURCE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:
                    submodule = f"{node.module}.{alias.name}"
                    targets.add(submodule if submodule in modules else node.module)
        graph[name] = {target for target in targets if target in modules and target != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                return stack[stack.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_the_package_has_no_import_cycle():
    assert find_cycle(import_graph()) is None


@pytest.mark.parametrize("math_layer", MATH_LAYERS)
def test_math_layers_import_nothing_above_them(math_layer):
    offending = sorted(
        f"{module} -> {target}"
        for module, targets in import_graph().items() if layer(module) == math_layer
        for target in targets if layer(target) in UPPER_LAYERS
    )
    assert not offending


def test_nothing_imports_the_command_line():
    offending = sorted(f"{module} -> {target}" for module, targets in import_graph().items()
                       if layer(module) != "cli" for target in targets if layer(target) == "cli")
    assert not offending


def test_only_the_command_line_imports_the_server():
    """``serve`` sits above ``api``, beside ``cli``: nothing below imports it."""
    offending = sorted(f"{module} -> {target}" for module, targets in import_graph().items()
                       if layer(module) not in ("serve", "cli") for target in targets if layer(target) == "serve")
    assert not offending


def test_the_server_imports_no_command_line_and_no_study():
    offending = sorted(f"{module} -> {target}" for module, targets in import_graph().items()
                       if layer(module) == "serve" for target in targets
                       if layer(target) in ("cli", "studies", "experiments", "plots"))
    assert not offending


def test_figures_know_nothing_of_how_numbers_are_computed():
    offending = sorted(f"{module} -> {target}" for module, targets in import_graph().items()
                       if layer(module) == "plots" for target in targets if layer(target) != "plots")
    assert not offending


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
