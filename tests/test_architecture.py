"""The package's layers, read from the source (DESIGN.md §1): imports only go down, no cycles;
and no unsafe loading anywhere in the code.

The import graph is built with `ast` from every module of ``flaxformer_lite/`` -- imports at
module level, in functions and under ``TYPE_CHECKING`` alike -- so a lazy import cannot hide
an upward dependency or a cycle. Each folder is a layer and may import only the layers listed
for it in `LAYERS`; `THIRD_PARTY` lists what a layer must not import from outside. The checker
is itself tested on a planted package (`test_the_checker_catches_planted_violations`).

A scan of the package, scripts, configs, benchmarks and notebooks finds no deserialiser that can
run code (pickle and kin, ``allow_pickle=True``, ``torch.load``, ``yaml.load``) and no ``eval``,
``exec`` or ``compile``; modules are executed only from the config paths the user passes
(`EXEC_MODULE_ALLOWED`). The scan is itself tested on lines it must and must not catch."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

PACKAGE = "flaxformer_lite"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE

# layer -> the layers it may import (besides itself)
LAYERS: dict[str, set[str]] = {
    "base": set(),
    "core": {"base"},
    "nn": {"base", "core"},
    "data": {"base"},
    "evaluation": {"base", "core", "nn", "data"},
    "train": {"base", "core", "nn", "data", "evaluation", "pretrained"},
    "pretrained": {"base", "core", "nn", "data"},
    # results rows, their comparability, statistics and significance
    "results": {"base", "core", "nn", "data", "evaluation", "train", "pretrained"},
    # two peers over results: the report (tables, plots, REPORT.md from rows alone) and the
    # study (sweeps and the runner, which never imports the report)
    "report": {"base", "results"},
    "study": {"base", "core", "nn", "data", "evaluation", "train", "pretrained", "results"},
    # the command: each subcommand calls the study, then the report
    "cli": {
        "base",
        "core",
        "nn",
        "data",
        "evaluation",
        "train",
        "pretrained",
        "results",
        "report",
        "study",
    },
}
# layer -> top-level third-party packages it must not import ("*": anything not stdlib)
THIRD_PARTY: dict[str, set[str]] = {
    "base": {"*"},
    "core": {"flax", "optax", "orbax", "tensorboardX", "tqdm", "matplotlib", "ml_collections"},
    "nn": {"optax", "orbax", "tensorboardX", "matplotlib", "ml_collections"},
    "data": {"jax", "jaxlib", "flax", "optax", "orbax", "tensorboardX", "matplotlib"},
    "evaluation": {"orbax", "tensorboardX", "matplotlib", "ml_collections"},
    # Hugging Face checkpoints are read with numpy: never torch (nor its pickles)
    "pretrained": {"torch", "transformers", "optax", "orbax", "tensorboardX", "matplotlib"},
}
API = PACKAGE  # the public facade flaxformer_lite/__init__.py may import every layer


def module_name(path: Path, root: Path, package: str) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([package, *parts])


def collect(root: Path, package: str = PACKAGE):
    """``(modules, imports)``: module name -> path, and per module a list of
    ``(imported name, line, in_function)`` for every import statement."""
    modules = {module_name(p, root, package): p for p in sorted(root.rglob("*.py"))}
    imports: dict[str, list[tuple[str, int, bool]]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_pkg = path.name == "__init__.py"
        found = []
        for node, in_function in _walk(tree, False):
            if isinstance(node, ast.Import):
                found += [(a.name, node.lineno, in_function) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(name, node, is_pkg)
                for a in node.names:
                    candidate = f"{base}.{a.name}"
                    target = candidate if candidate in modules else base
                    found.append((target, node.lineno, in_function))
        imports[name] = found
    return modules, imports


def _walk(node: ast.AST, in_function: bool):
    for child in ast.iter_child_nodes(node):
        inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
        yield child, inner
        yield from _walk(child, inner)


def _absolute(module: str, node: ast.ImportFrom, is_pkg: bool) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    if not is_pkg:
        parts = parts[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def layer_of(module: str, package: str = PACKAGE) -> str:
    """The folder (layer) of ``module``; the package's own ``__init__`` and ``__main__``
    (``python -m flaxformer_lite``, the command) are the top, like the public facade."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] != "__main__" else API


def internal_edges(modules, imports, package: str = PACKAGE):
    """``{module: {(imported module, line, in_function)}}`` within the package."""
    edges = {}
    for name, found in imports.items():
        out = set()
        for target, line, lazy in found:
            if target == package or target.startswith(package + "."):
                while target not in modules and "." in target:
                    target = target.rsplit(".", 1)[0]
                out.add((target, line, lazy))
        edges[name] = out
    return edges


def violations(root: Path, package: str = PACKAGE) -> list[str]:
    """Every breach of the layering rules, as readable lines (empty: the house is in order)."""
    modules, imports = collect(root, package)
    edges = internal_edges(modules, imports, package)
    problems = []
    for name, out in sorted(edges.items()):
        here = layer_of(name, package)
        if here != API and here not in LAYERS:
            problems.append(f"{name}: folder {here!r} is not a known layer; add it to LAYERS")
            continue
        for target, line, lazy in sorted(out):
            there = layer_of(target, package)
            where = f"{modules[name].relative_to(root.parent)}:{line}"
            if here == API:
                continue
            if there == API:
                problems.append(f"{where}: {name} imports the public facade {package}")
            elif there != here and there not in LAYERS[here]:
                problems.append(f"{where}: {here}/ may not import {there}/ ({name} -> {target})")
            if lazy:
                problems.append(f"{where}: {name} imports {target} inside a function")
    stdlib = set(sys.stdlib_module_names)
    for name, found in sorted(imports.items()):
        forbidden = THIRD_PARTY.get(layer_of(name, package), set())
        for target, line, _ in found:
            top = target.split(".")[0]
            if top in (package, "__future__") or not top:
                continue
            outside = top not in stdlib
            if (top in forbidden) or ("*" in forbidden and outside):
                where = f"{modules[name].relative_to(root.parent)}:{line}"
                problems.append(f"{where}: {layer_of(name, package)}/ may not import {top}")
    for cycle in cycles({n: {t for t, _, _ in out} for n, out in edges.items()}):
        problems.append("import cycle: " + " -> ".join([*cycle, cycle[0]]))
    return problems


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (or a self-import)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_every_folder_is_a_layer_and_imports_only_go_down():
    assert violations(ROOT) == []


def test_the_graph_sees_the_whole_package():
    modules, imports = collect(ROOT)
    layers = {layer_of(m) for m in modules}
    assert layers == set(LAYERS) | {API}
    edges = internal_edges(modules, imports)
    targets = lambda m: {t for t, _, _ in edges[m]}
    # edges that must be there (the graph is not empty by accident)
    assert "flaxformer_lite.core.attention" in targets("flaxformer_lite.nn.layers")
    assert "flaxformer_lite.evaluation.run" in targets("flaxformer_lite.train.loop")
    assert "flaxformer_lite.nn.encodings.registry" in targets("flaxformer_lite.nn.model_config")


def test_each_layer_says_what_it_may_import():
    for layer in LAYERS:
        doc = ast.get_docstring(ast.parse((ROOT / layer / "__init__.py").read_text()))
        assert doc and "import" in doc.lower(), f"{layer}/__init__.py must say what it may import"


def _plant(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


CLEAN = {
    "__init__.py": "from pkg.nn import models\n",
    "base/__init__.py": '"""May import: nothing."""\n',
    "base/checks.py": "import math\n",
    "core/__init__.py": "",
    "core/attention.py": "import jax\nfrom pkg.base import checks\n",
    "nn/__init__.py": "",
    "nn/models.py": "from flax import nnx\nfrom pkg.core import attention\n",
}


@pytest.mark.parametrize(
    ("planted", "expected"),
    [
        ({"core/attention.py": "from pkg.nn import models\n"}, "core/ may not import nn/"),
        ({"core/attention.py": "def f():\n    from pkg.nn import models\n"}, "inside a function"),
        ({"core/attention.py": "from flax import nnx\n"}, "core/ may not import flax"),
        ({"base/checks.py": "import numpy\n"}, "base/ may not import numpy"),
        ({"nn/models.py": "import pkg\n"}, "imports the public facade pkg"),
        (
            {
                "nn/layers.py": "from pkg.nn import models\n",
                "nn/models.py": "from . import layers\n",
            },
            "import cycle: pkg.nn.layers -> pkg.nn.models",
        ),
        ({"widgets/__init__.py": ""}, "folder 'widgets' is not a known layer"),
    ],
)
def test_the_checker_catches_planted_violations(tmp_path, planted, expected):
    assert violations(_plant(tmp_path, CLEAN), "pkg") == []
    problems = violations(_plant(tmp_path / "bad", CLEAN | planted), "pkg")
    assert any(expected in p for p in problems), problems


def test_no_encoding_name_is_compared_outside_the_registry():
    """Code outside nn/encodings/ asks the registry (spec capabilities), never compares a name:
    no string literal equal to a registered encoding name appears in a comparison there.
    ("none" is also RoPE's "no scaling" value: it counts only where the other side of the
    comparison mentions the encoding.)"""
    from flaxformer_lite.nn.encodings import positional_encoding_names

    names = set(positional_encoding_names())
    hits = []
    for path in sorted(ROOT.rglob("*.py")):
        if "encodings" in path.relative_to(ROOT).parts:
            continue
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.Compare):
                continue
            text = ast.get_source_segment(source, node) or ""
            for c in [node.left, *node.comparators]:
                elts = c.elts if isinstance(c, ast.Tuple | ast.List | ast.Set) else [c]
                for e in elts:
                    if not (isinstance(e, ast.Constant) and e.value in names):
                        continue
                    if e.value != "none" or "positional" in text or "encoding" in text:
                        hits.append(f"{path.relative_to(ROOT)}:{node.lineno}: {text}")
    assert hits == []


REPO = Path(__file__).resolve().parent.parent


SOURCES = ("flaxformer_lite", "scripts", "configs", "benchmarks", "notebooks")


# Deserialisers that can run code, and dynamic code execution.
UNSAFE = re.compile(
    r"\bimport (c?pickle|dill|cloudpickle|shelve|marshal)\b|\bfrom (c?pickle|dill|cloudpickle"
    r"|shelve|marshal) import|\bpickle\.|allow_pickle\s*=\s*True|\btorch\.load\(|"
    r"\byaml\.(unsafe_)?load\(|(?<![\w.])eval\(|(?<![\w.])exec\(|__import__\(|(?<![\w.])compile\("
)


# Where a config file given on the command line (--config=FILE.py:PRESET) is executed, besides
# ml_collections.config_flags itself: the error explainer that re-reads it to name a bad
# override's allowed fields, the task study that reuses its sibling
# configs/extrapolation_lm.py, and the notebook's experiment file. (The study runner reads
# the sweep from the config itself, `study.sweeps`, and executes nothing.)
EXEC_MODULE_ALLOWED = {
    "flaxformer_lite/cli/common.py",
    "configs/extrapolation_tasks.py",
    "notebooks/extrapolation.ipynb",
}


def _source_files():
    for top in SOURCES:
        for path in sorted((REPO / top).rglob("*")):
            if path.suffix in (".py", ".ipynb") and ".ipynb_checkpoints" not in path.parts:
                yield path


def test_no_pickle_eval_or_exec_in_the_code():
    files = list(_source_files())
    assert any(p.name == "checkpoint.py" for p in files)  # the scan sees the package
    hits = []
    for path in files:
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            code = line.split("#")[0]
            if UNSAFE.search(code):
                hits.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert hits == []


def test_modules_are_executed_only_from_user_given_config_paths():
    users = {
        str(p.relative_to(REPO))
        for p in _source_files()
        if "exec_module" in p.read_text() or "spec_from_file_location" in p.read_text()
    }
    assert users <= EXEC_MODULE_ALLOWED, users - EXEC_MODULE_ALLOWED
    assert "flaxformer_lite/cli/common.py" in users


def test_the_scan_catches_what_it_should():
    for bad in (
        "import pickle",
        "x = pickle.loads(b)",
        "np.load(p, allow_pickle=True)",
        "eval(text)",
        "exec(code)",
        "from cloudpickle import loads",
        "yaml.load(f)",
        "compile(src, 'x', 'exec')",
    ):
        assert UNSAFE.search(bad), bad
    fine_lines = ("evaluate(m)", "quick_evaluate(m)", "loader.exec_module(m)", "re.compile(p)")
    for fine in (*fine_lines, "m.eval()"):
        assert not UNSAFE.search(fine), fine
