"""Requirement syntax of jobs.txt (``requires=ID[:[best:|final:]METRIC OP VALUE]``): parsed here, used by the job
file's validation (experiments.queue.jobfile) and evaluated by the gates (experiments.queue.gates)."""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from typing import Optional

from core.errors import PlatformError


class JobFileError(PlatformError, ValueError):
    """A malformed jobs file; the message names file, line and the offending text."""


OPS = {">=": operator.ge, "<=": operator.le, "==": operator.eq, "!=": operator.ne, ">": operator.gt, "<": operator.lt}
_EXPR_RE = re.compile(
    r"^(?:(?P<section>best|final):)?(?P<metric>[^<>=!]+?)\s*(?P<op>>=|<=|==|!=|>|<)\s*(?P<value>\S+)$"
)
SECTIONS = ("best", "final")


@dataclass(frozen=True)
class Requirement:
    job_id: str
    metric: Optional[str] = None
    op: Optional[str] = None
    threshold: Optional[float] = None
    section: Optional[str] = None  # "best" | "final" | None (auto)

    def describe(self) -> str:
        if self.metric is None:
            return f"{self.job_id} done"
        sec = f"{self.section}:" if self.section else ""
        return f"{self.job_id} {sec}{self.metric}{self.op}{self.threshold:g}"


def parse_requirement(spec: str, where: str = "") -> Requirement:
    """``"ID"`` or ``"ID:[best:|final:]METRIC OP VALUE"`` -> :class:`Requirement`."""
    pre = f"{where}: " if where else ""
    job_id, _, expr = spec.partition(":")
    if not job_id:
        raise JobFileError(f"{pre}requirement {spec!r} has no job id (expected ID[:metric>value])")
    if not expr:
        return Requirement(job_id)
    m = _EXPR_RE.match(expr.strip())
    if m is None:
        raise JobFileError(
            f"{pre}bad requirement {spec!r}: expected ID:METRIC OP VALUE with OP in {', '.join(OPS)}, "
            f"e.g. overfit:train/exact_accuracy>0.90"
        )
    try:
        value = float(m.group("value"))
    except ValueError:
        raise JobFileError(f"{pre}bad threshold {m.group('value')!r} in requirement {spec!r} (not a number)") from None
    return Requirement(job_id, m.group("metric").strip(), m.group("op"), value, m.group("section"))
