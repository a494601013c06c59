"""The data layer is numpy-only: no flax or jax import, and `datasets` only inside a function."""

import ast
from pathlib import Path

import flaxformer_lite.data

DATA_DIR = Path(flaxformer_lite.data.__file__).parent
SOURCES = sorted(DATA_DIR.glob("*.py"))


def _imports(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield node, [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node, [node.module.split(".")[0]]


def test_no_flax_or_jax_imports():
    assert len(SOURCES) >= 6
    for path in SOURCES:
        for _, roots in _imports(ast.parse(path.read_text())):
            assert not {"flax", "jax", "jaxlib"} & set(roots), path.name


def test_datasets_is_imported_lazily():
    found = 0
    for path in SOURCES:
        tree = ast.parse(path.read_text())
        top_level = {id(n) for n in tree.body}
        for node, roots in _imports(tree):
            if "datasets" in roots:
                found += 1
                assert id(node) not in top_level, f"{path.name}: top-level import of datasets"
    assert found == 1
