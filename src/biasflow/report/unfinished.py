"""The jobs of a run that did not finish, as rows of the Markdown and the HTML report (one table, two renderings)."""
from __future__ import annotations

UNFINISHED_HEAD = ["model", "metric", "state", "SLURM state", "attempts (memory, time limit, end)", "cause", "log"]


def unfinished_rows(unfinished) -> list[list[str]]:
    """model, metric, state, SLURM state, attempts (what each asked for and how it ended), cause, log."""
    return [[u.model, u.metric, u.state, getattr(u, "slurm_state", None) or "",
             u.attempts_text() if hasattr(u, "attempts_text") else "", u.error or "", u.log or ""]
            for u in unfinished]


__all__ = ["UNFINISHED_HEAD", "unfinished_rows"]
