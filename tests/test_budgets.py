"""Size budgets, checked in the test command: a module that outgrows 500 lines is split into cohesive modules, and a
reference doc (docs/*.md) states what is true now in at most 300 lines (docs/science.md under 250), its dated
findings and long measurement tables in docs/record/. The failure names every file over its budget and its count."""

from __future__ import annotations

import glob
import os

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
