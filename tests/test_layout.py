"""The package's layers, read from its own import statements (every ``import`` and ``from …
import``, at module level or inside a function): no module imports itself back through a
cycle, every top-level module has a rank in ``RANKS`` and imports nothing of a higher rank,
the math layers import nothing of the engine, the models, the studies, the experiments, the
figures or the command line, and only the backends name a backend."""

import ast
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[1] / "src" / "specbound"
MATH_LAYERS = ("checks", "probability", "statistics", "bounds", "drafts", "verifiers", "chains")
UPPER_LAYERS = ("engine", "models", "studies", "experiments", "plots", "api", "audit", "serve", "cli")
# Each top-level module (package or file) by rank, lowest first: a module imports modules of
# its own rank or below, never above. A new top-level module must be given its rank here.
RANKS = {
    "checks": 0, "paths": 0, "work_limits": 0, "lazy": 0,  # argument checks, the cache root, work limits, lazy names
    "compiled": 1, "arguments": 1, "datasets": 1,  # numba loops, argparse types, prompt sets
    "probability": 2, "statistics": 2,
    "bounds": 3, "drafts": 3, "verifiers": 3, "chains": 3,  # the math
    "engine": 4,  # decoding, its backends
    "models": 5,  # model files, loading, the pair
    "api": 6, "audit": 6, "studies": 6, "experiments": 6, "plots": 6,
    "serve": 7,
    "cli": 8,
    "": 9,  # the package itself (``specbound.Speculator``)
}
BACKEND_NAMES = ("llama.cpp", "torch")


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


def test_every_top_level_module_has_a_rank():
    """A module the table does not know fails here until it is placed in a layer."""
    unknown = sorted({layer(module) for module in import_graph()} - set(RANKS))
    assert not unknown


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{module} -> {target}" for module, targets in graph.items() for target in targets
                  if RANKS.get(layer(target), 0) > RANKS.get(layer(module), 0))


def test_no_module_imports_a_module_of_a_higher_rank():
    assert not upward_imports(import_graph())


def test_the_engine_imports_no_model_loading_and_compiled_loops_no_model_file():
    graph = import_graph()
    offending = sorted(f"{module} -> {target}" for module, targets in graph.items()
                       if layer(module) in ("engine", "compiled") for target in targets if layer(target) == "models")
    assert not offending


def test_only_the_backends_compare_backend_names():
    """No ``x == "llama.cpp"`` (or ``"torch"``, or ``in (...)`` of them) outside
    ``engine/backends``: a backend object says what differs, nothing asks which it is."""
    backends = SOURCE / "engine" / "backends"
    offending = []
    for path in SOURCE.rglob("*.py"):
        if backends in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                named = [constant.value for operand in operands for constant in ast.walk(operand)
                         if isinstance(constant, ast.Constant) and constant.value in BACKEND_NAMES]
                if named:
                    offending.append(f"{module_name(path)}:{node.lineno} compares with {named[0]!r}")
    assert not offending


def test_the_rank_check_finds_an_upward_import():
    graph = {"specbound.engine.decode": {"specbound.models.pair"}, "specbound.models.pair": set()}
    assert upward_imports(graph) == ["specbound.engine.decode -> specbound.models.pair"]
