"""Markdown tables, the one format of the comparison commands (``training.compare_runs``,
``experiments.science.compare``): what they print is what docs/ pastes."""

from __future__ import annotations

from typing import Any, Sequence


def cell(value: Any) -> str:
    """A table cell: the text of ``value`` with ``|`` escaped and line breaks as spaces."""
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]], right: Sequence[bool] = ()) -> list[str]:
    """The lines of a markdown table: ``header``, the rule (column ``i`` right-aligned, ``---:``, where
    ``right[i]``), then one line per row. Header and cells are written as given (bold, code spans: the caller's);
    use :func:`cell` for values that may hold ``|``."""
    rule = ["---:" if i < len(right) and right[i] else "---" for i in range(len(header))]
    return ["| " + " | ".join(header) + " |", "|" + "|".join(rule) + "|"] + [
        "| " + " | ".join(str(c) for c in row) + " |" for row in rows
    ]
