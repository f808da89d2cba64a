"""The package's layers, read from its own import statements (every ``import`` and ``from …
import``, at module level or inside a function): no module imports itself back through a
cycle, every top-level module has a rank in ``RANKS`` and imports nothing of a higher rank,
the math layers import nothing of the engine, the models, the studies, the tables, the
figures or the command line, and only the backends know a backend: outside ``engine/backends``
no code compares with a backend's name, keeps a table keyed by backend names, or asks which
class a model is (``isinstance`` of a backend's class or of a torch module, ``hasattr`` of a
name only one backend's classes have, ``type(x).__name__``). Two modules never import each
other, a package below a layer (``engine.backends``, which loads its modules by name) counted
as one module. A decoder is finished when ``engine.assembly`` returns it: nothing else sets
another object's ``optimum`` or ``prefill_progress``; no class defines a method twice; and a
schedule is typed ``Schedule``, never ``Method | Planner``. No test file imports another: what
tests share lives in ``tests/support``."""

import ast
import functools
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[1] / "src" / "specbound"
MATH_LAYERS = ("checks", "probability", "statistics", "bounds", "drafts", "verifiers", "chains")
UPPER_LAYERS = ("engine", "models", "studies", "tables", "plots", "api", "audit", "serve", "cli")
# Each top-level module (package or file) by rank, lowest first: a module imports modules of
# its own rank or below, never above. A new top-level module must be given its rank here.
RANKS = {
    "checks": 0, "paths": 0, "work_limits": 0, "lazy": 0,  # argument checks, the cache root, work limits, lazy names
    "compiled": 1, "arguments": 1, "datasets": 1,  # numba loops, argparse types, prompt sets
    "probability": 2, "statistics": 2,
    "bounds": 3, "drafts": 3, "verifiers": 3, "chains": 3,  # the math
    "engine": 4,  # decoding, its backends
    "models": 5,  # model files, loading, the pair
    "api": 6, "audit": 6, "studies": 6, "tables": 6, "plots": 6,
    "serve": 7,
    "cli": 8,
    "": 9,  # the package itself (``specbound.Speculator``)
}
BACKEND_NAMES = ("llama.cpp", "torch")


@functools.cache
def parsed(path: Path) -> ast.Module:
    """The syntax tree of a source file, parsed once per test session."""
    return ast.parse(path.read_text(), filename=str(path))


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
        for node in ast.walk(parsed(path)):
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
                       if layer(target) in ("cli", "studies", "tables", "plots"))
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
        for node in ast.walk(parsed(path)):
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


def collapsed(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph with each package below a layer (``specbound.engine.backends``) as one
    node: its ``__init__`` loads its modules by name (``get_backend``), which no import
    statement shows, so an import of the package reaches every module in it."""
    packages = {path.parent for path in SOURCE.glob("*/*/__init__.py")}
    names = {module_name(package / "__init__.py") for package in packages}

    def node(module: str) -> str:
        return next((name for name in names if module == name or module.startswith(name + ".")), module)

    merged: dict[str, set[str]] = {}
    for module, targets in graph.items():
        merged.setdefault(node(module), set()).update(node(target) for target in targets)
    return {module: targets - {module} for module, targets in merged.items()}


def mutual_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{module} <-> {target}" for module, targets in graph.items() for target in targets
                  if module < target and module in graph.get(target, ()))


def test_no_two_modules_import_each_other_a_package_below_a_layer_counted_as_one():
    """Function-level imports count: an import inside a function body is an import."""
    graph = collapsed(import_graph())
    assert not mutual_imports(graph)
    assert find_cycle(graph) is None


def test_the_mutual_import_check_finds_one_through_a_package_loaded_by_name():
    graph = {"specbound.engine.costs": {"specbound.engine.backends"},
             "specbound.engine.backends": set(),
             "specbound.engine.backends.torch": {"specbound.engine.costs", "specbound.engine.backends"}}
    assert mutual_imports(collapsed(graph)) == ["specbound.engine.backends <-> specbound.engine.costs"]


def outside_the_backends() -> list[tuple[str, ast.AST]]:
    """(module, parsed tree) of every module outside ``engine/backends``."""
    backends = SOURCE / "engine" / "backends"
    return [(module_name(path), parsed(path))
            for path in sorted(SOURCE.rglob("*.py")) if backends not in path.parents]


def backend_tables(module: str, tree: ast.AST) -> list[str]:
    """Dict displays whose keys are all backend names (``{"torch": ..., "llama.cpp": ...}``)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict) and node.keys and all(
                isinstance(key, ast.Constant) and key.value in BACKEND_NAMES for key in node.keys):
            found.append(f"{module}:{node.lineno} keys a table by backend name")
    return found


def test_only_the_backends_keep_tables_keyed_by_backend_name():
    """A loader, a module or a setting per backend belongs on the ``Backend`` object."""
    assert not [found for module, tree in outside_the_backends() for found in backend_tables(module, tree)]


def backend_classes() -> tuple[set[str], set[str]]:
    """(the classes the backends define, the attribute names only their concrete classes
    have: what the protocol in ``engine/backends/__init__.py`` does not name)."""
    backends = SOURCE / "engine" / "backends"
    classes, concrete, protocol = set(), set(), set()
    for path in backends.glob("*.py"):
        for node in ast.walk(parsed(path)):
            if not isinstance(node, ast.ClassDef):
                continue
            classes.add(node.name)
            members = {item.name for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))}
            members |= {item.target.id for item in node.body
                        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)}
            members |= {target.attr for item in ast.walk(node) if isinstance(item, ast.Assign)
                        for target in item.targets if isinstance(target, ast.Attribute)
                        and isinstance(target.value, ast.Name) and target.value.id == "self"}
            (protocol if path.name == "__init__.py" else concrete).update(members)
    return classes, {name for name in concrete - protocol if not name.startswith("__")}


TORCH_MODULES = ("Module", "PreTrainedModel")  # torch.nn.Module, transformers' models: the torch backend's


def class_tests(module: str, tree: ast.AST, classes: set[str], members: set[str]) -> list[str]:
    """``isinstance(x, C)`` of a backend's class or a torch module, ``hasattr(x, name)`` of a
    name only a backend's concrete classes have, and ``type(x)`` compared (``.__name__`` or
    the class itself)."""
    def class_name(node: ast.AST) -> str | None:
        return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None

    def is_type_call(node: ast.AST) -> bool:
        node = node.value if isinstance(node, ast.Attribute) and node.attr == "__name__" else node
        return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "type"

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) == 2:
            kind, tested = node.func.id, node.args[1]
            if kind in ("isinstance", "issubclass"):
                names = {class_name(item) for item in (tested.elts if isinstance(tested, ast.Tuple) else [tested])}
                if probed := sorted(names & (classes | set(TORCH_MODULES))):
                    found.append(f"{module}:{node.lineno} {kind} of {probed}")
            elif kind == "hasattr" and isinstance(tested, ast.Constant) and tested.value in members:
                found.append(f"{module}:{node.lineno} hasattr {tested.value!r}")
        elif isinstance(node, ast.Compare) and any(is_type_call(operand) for operand in [node.left, *node.comparators]):
            found.append(f"{module}:{node.lineno} compares a type")
    return found


def test_only_the_backends_ask_which_class_a_model_is():
    """Outside the backends a model is asked through its ``Backend`` (``backend_of``), never
    tested for a class: a third backend then touches ``engine/backends`` only."""
    classes, members = backend_classes()
    assert {"CausalLM", "LlamaCppModel"} <= classes and "scorer" in members and "score" not in members
    assert not [found for module, tree in outside_the_backends()
                for found in class_tests(module, tree, classes, members)]


def test_the_class_test_check_finds_each_kind_of_probe():
    source = """
if isinstance(model, torch.nn.Module): pass
if not isinstance(model, (LlamaCppModel, int)): pass
if hasattr(model, "scorer"): pass
if type(model).__name__ == "CausalLM": pass
if hasattr(model, "score") or isinstance(model, int) or type(model) is object: pass
table = {"torch": 1, "llama.cpp": 2}
servers = {"llama.cpp": 1, "vllm": 2}
"""
    tree = ast.parse(source)
    found = class_tests("m", tree, {"LlamaCppModel"}, {"scorer"})
    assert sorted(int(line.split(" ", 1)[0].removeprefix("m:")) for line in found) == [2, 3, 4, 5, 6]
    assert backend_tables("m", tree) == ["m:7 keys a table by backend name"]


ASSEMBLED = ("optimum", "prefill_progress")  # what a decoder is built with; what engine.assembly gives its models


def patched_after_assembly(module: str, tree: ast.AST, attributes=ASSEMBLED) -> list[str]:
    """Assignments to ``x.optimum`` or ``x.prefill_progress`` (of ``attributes``) where ``x``
    is not ``self``."""
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AnnAssign, ast.AugAssign)) else []
        for target in targets:
            if isinstance(target, ast.Attribute) and target.attr in attributes and not (
                    isinstance(target.value, ast.Name) and target.value.id == "self"):
                found.append(f"{module}:{node.lineno} sets .{target.attr}")
    return found


def test_nothing_but_the_assembly_equips_a_decoder_after_it_is_built():
    """A decoder takes its optimum recorder in its constructor (``Decoder(..., optimum=)``):
    nothing sets it afterwards; only ``engine.assembly`` gives the language models their
    prefill progress."""
    assert not [found for path in sorted(SOURCE.rglob("*.py"))
                for found in patched_after_assembly(module_name(path), parsed(path), ("optimum",))]
    assert not [found for path in sorted(SOURCE.rglob("*.py")) if module_name(path) != "specbound.engine.assembly"
                for found in patched_after_assembly(module_name(path), parsed(path))]


def methods_defined_twice(module: str, tree: ast.AST) -> list[str]:
    """Names a class body defines twice (the second silently replaces the first); a property's
    setter or deleter and ``typing.overload`` excepted."""
    def exempt(function) -> bool:
        return any(isinstance(decorator, ast.Attribute) and decorator.attr in ("setter", "deleter")
                   or isinstance(decorator, ast.Name) and decorator.id == "overload"
                   for decorator in function.decorator_list)

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            names = [item.name for item in node.body
                     if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and not exempt(item)]
            found += [f"{module}: {node.name}.{name}" for name in sorted(set(names)) if names.count(name) > 1]
    return found


def test_no_class_defines_a_method_twice():
    assert not [found for path in sorted(SOURCE.rglob("*.py"))
                for found in methods_defined_twice(module_name(path), parsed(path))]


def method_or_planner_unions(module: str, tree: ast.AST) -> list[str]:
    """``Method | Planner`` (either order, in any union): a ``Schedule`` is meant."""
    def names(node) -> set[str]:
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return names(node.left) | names(node.right)
        return {node.id} if isinstance(node, ast.Name) else {node.attr} if isinstance(node, ast.Attribute) else set()

    return [f"{module}:{node.lineno} Method | Planner" for node in ast.walk(tree)
            if isinstance(node, ast.BinOp) and {"Method", "Planner"} <= names(node)]


def test_a_schedule_is_typed_schedule():
    assert not [found for path in sorted(SOURCE.rglob("*.py"))
                for found in method_or_planner_unions(module_name(path), parsed(path))]


def test_the_assembly_checks_find_what_they_look_for():
    tree = ast.parse("""
decoder.optimum = OptimumRecorder()
lm.prefill_progress: object = None
self.optimum = None
class A:
    def f(self): pass
    @property
    def g(self): pass
    @g.setter
    def g(self, value): pass
    def f(self): pass
schedule: Method | None | Planner = None
""")
    assert patched_after_assembly("m", tree) == ["m:2 sets .optimum", "m:3 sets .prefill_progress"]
    assert methods_defined_twice("m", tree) == ["m: A.f"]
    assert method_or_planner_unions("m", tree)[:1] == ["m:12 Method | Planner"]


TESTS = Path(__file__).resolve().parent


def imported_test_modules(tree: ast.AST) -> list[str]:
    """The test modules (``test_*``) that ``tree`` imports: what tests share lives in
    ``tests/support``, so no test file is another's library."""
    found = []
    for node in ast.walk(tree):
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        found += [name for name in names if name.split(".")[-1].startswith("test_")]
    return found


def test_no_test_file_imports_another():
    assert not {path.relative_to(TESTS).as_posix(): imported for path in sorted(TESTS.rglob("*.py"))
                if (imported := imported_test_modules(ast.parse(path.read_text())))}
    assert imported_test_modules(ast.parse("from test_engine_lossless import PROMPT\ndef f():\n    import test_x\n")) \
        == ["test_engine_lossless", "test_x"]
