"""The layer rule of docs/architecture.md, checked in the test command: each package imports only packages below
it (core < dataset < encoders < models < evaluators < training < experiments), and no module imports itself back
through a cycle. Entry points (pretrain.py, evaluate.py, ...), benchmarks/ and scripts/ sit on top."""

from __future__ import annotations

import ast
import graphlib
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYERS = ("core", "dataset", "encoders", "models", "evaluators", "training", "experiments")


def _modules() -> dict[str, str]:
    """dotted module name -> file, for every module of the layered packages."""
    out = {}
    for pkg in LAYERS:
        for d, _dirs, files in os.walk(os.path.join(ROOT, pkg)):
            for f in files:
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(d, f), ROOT)[:-3].split(os.sep)
                    out[".".join(rel[:-1] if rel[-1] == "__init__" else rel)] = os.path.join(d, f)
    return out


def _imports(name: str, path: str, known: set[str]) -> set[str]:
    """The in-repo modules ``name`` imports (anywhere in the file), resolved to the longest known prefix."""
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(m, p, set(mods)) for m, p in mods.items()}


def test_no_package_imports_a_layer_above_it(graph):
    rank = {p: i for i, p in enumerate(LAYERS)}
    upward = sorted(
        f"{m} -> {t}" for m, ts in graph.items() for t in ts if rank[t.split(".")[0]] > rank[m.split(".")[0]]
    )
    assert upward == []


def test_no_import_cycles(graph):
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as e:
        pytest.fail(f"import cycle: {' -> '.join(e.args[1])}")


def test_the_documented_order_is_the_checked_one():
    with open(os.path.join(ROOT, "README.md")) as f:
        line = next(ln for ln in f if "`core/` <" in ln)
    assert tuple(re.findall(r"`(\w+)/`", line)) == LAYERS
    with open(os.path.join(ROOT, "docs", "architecture.md")) as f:
        text = f.read()
    positions = [text.index(f"\n {p}/") for p in reversed(LAYERS)]  # the diagram lists the top layer first
    assert positions == sorted(positions)


def test_the_checker_sees_an_upward_import_and_a_cycle(tmp_path):
    """The checks can fail: a module of models/ importing training/ is upward, two modules importing each other
    form a cycle."""
    (tmp_path / "a.py").write_text("from models import b\n")
    (tmp_path / "b.py").write_text("import training.loop\nfrom . import a\n")
    known = {"models", "models.a", "models.b", "training", "training.loop"}
    g = {
        "models.a": _imports("models.a", str(tmp_path / "a.py"), known),
        "models.b": _imports("models.b", str(tmp_path / "b.py"), known),
    }
    assert g == {"models.a": {"models.b"}, "models.b": {"training.loop", "models.a"}}
    with pytest.raises(graphlib.CycleError):
        graphlib.TopologicalSorter({k: v & {"models.a", "models.b"} for k, v in g.items()}).prepare()
