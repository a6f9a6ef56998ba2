"""Size budgets, checked in the test command: a module that outgrows 500 lines is split into cohesive modules, and a
reference doc (docs/*.md) states what is true now in at most 300 lines (docs/science.md under 250), its dated
findings and long measurement tables in docs/record/. The failure names every file over its budget and its count.
And models/' docstrings and comments state what the code does: no measured figure (an accuracy, a speed, a verdict
such as "beats"), which goes stale when the code or the data change (measurements live in docs/record/), and every
dotted name they give (``models.legacy.REMOVED``) exists."""

from __future__ import annotations

import ast
import glob
import importlib
import io
import os
import re
import tokenize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("core", "dataset", "encoders", "models", "evaluators", "training", "experiments", "benchmarks")
MODULE_BUDGET = 500
DOC_BUDGET = 300
SCIENCE_BUDGET = 249  # docs/science.md: under 250


def _lines(path: str) -> int:
    with open(path, encoding="utf-8") as f:
        return sum(1 for _ in f)


def _modules() -> list[str]:
    """Every non-test .py file of the project's packages and the top-level entry scripts (repository-relative)."""
    out = [f for f in os.listdir(ROOT) if f.endswith(".py")]
    for pkg in PACKAGES:
        for d, dirs, files in os.walk(os.path.join(ROOT, pkg)):
            dirs[:] = [x for x in dirs if x not in ("tests", "__pycache__")]
            for f in files:
                if f.endswith(".py") and not f.startswith("test_") and f != "conftest.py":
                    out.append(os.path.relpath(os.path.join(d, f), ROOT))
    return sorted(out)


def _over(paths: list[str], budget: int) -> list[str]:
    return [f"{p}: {n} lines (budget {budget})" for p in paths if (n := _lines(os.path.join(ROOT, p))) > budget]


def test_modules_are_at_most_500_lines():
    mods = _modules()
    assert len(mods) > 100 and "dataset/build_synthetic_dataset.py" in mods and "pretrain.py" in mods
    over = _over(mods, MODULE_BUDGET)
    assert not over, "modules over budget (split them into cohesive modules):\n" + "\n".join(over)


def test_reference_docs_are_within_budget():
    docs = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
    assert "docs/science.md" in docs and not any(d.startswith("docs/record/") for d in docs)
    over = _over([d for d in docs if d != "docs/science.md"], DOC_BUDGET) + _over(["docs/science.md"], SCIENCE_BUDGET)
    assert not over, "reference docs over budget (move dated findings and long tables to docs/record/):\n" + "\n".join(
        over
    )


def test_the_budget_check_counts_lines_and_names_the_file(tmp_path):
    p = tmp_path / "big.py"
    p.write_text("x = 1\n" * 501)
    assert _lines(str(p)) == 501
    assert _over([str(p)], 500) == [f"{p}: 501 lines (budget 500)"]
    assert _over([str(p)], 501) == []


# a measured figure: a score written 0.NN, a percentage, a speed comparison, a verdict
FIGURE = re.compile(r"\b0\.\d{2,}\b|\d%|\d\s?percent\b|\b(?:faster|slower|wins?|won|lost|loses|beats?)\b", re.I)
DOTTED = re.compile(r"(?<![\w./-])(models(?:\.[A-Za-z_]\w*)+)")  # (core.x: also a variable named core)


def _prose(path: str) -> list[tuple[int, str]]:
    """(line, text) of every docstring line (modules, classes, functions) and every comment of a Python file; string
    literals that are data (e.g. models.legacy.REMOVED's refusals, which name their measurement by design) are not
    prose."""
    with open(path, encoding="utf-8") as f:
        src = f.read()
    out = []
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                out += [(node.body[0].lineno + i, t) for i, t in enumerate(doc.splitlines())]
    tokens = tokenize.generate_tokens(io.StringIO(src).readline)
    return sorted(out + [(t.start[0], t.string) for t in tokens if t.type == tokenize.COMMENT])


def _figures(paths: list[str]) -> list[str]:
    return [f"{p}:{n}: {t.strip()}" for p in paths for n, t in _prose(os.path.join(ROOT, p)) if FIGURE.search(t)]


def _resolves(name: str) -> bool:
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:n]))
        except ImportError:
            continue
        for attr in parts[n:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def _unresolved(paths: list[str]) -> list[str]:
    return [
        f"{p}:{n}: {m}"
        for p in paths
        for n, t in _prose(os.path.join(ROOT, p))
        for m in DOTTED.findall(t)
        if not _resolves(m.rstrip("."))
    ]


def test_models_docstrings_and_comments_quote_no_figure_and_name_what_exists():
    mods = [m for m in _modules() if m.startswith("models" + os.sep)]
    assert len(mods) > 15 and os.path.join("models", "variants", "trm_views.py") in mods
    figures = _figures(mods)
    assert not figures, "measured figures in models/ (state what the code does; point at docs/record/):\n" + "\n".join(
        figures
    )
    unresolved = _unresolved(mods)
    assert not unresolved, "dotted names in models/ that do not exist:\n" + "\n".join(unresolved)


def test_the_prose_check_flags_figures_and_missing_names_in_docstrings_and_comments(tmp_path):
    p = tmp_path / "m.py"
    p.write_text(
        '"""The grid core: held-out 0.92 on the 8 families (``models.legacy.REMOVED``)."""\n'
        "\n\n"
        "def f():\n"
        '    """Three times faster than the pooled core; ``models.variants.REMOVED``."""\n'
        "    return 0.75  # beats the pooled core, 30% of the time\n"
        "\n\n"
        'X = "lost: 0.55"  # a hidden size of 0.5 x 512, scale 1.25\n'
    )
    assert _figures([str(p)]) == [
        f"{p}:1: The grid core: held-out 0.92 on the 8 families (``models.legacy.REMOVED``).",
        f"{p}:5: Three times faster than the pooled core; ``models.variants.REMOVED``.",
        f"{p}:6: # beats the pooled core, 30% of the time",
    ]
    assert _unresolved([str(p)]) == [f"{p}:5: models.variants.REMOVED"]
