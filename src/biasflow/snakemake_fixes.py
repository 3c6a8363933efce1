"""Fixes to Snakemake itself, installed by the Snakefile (SLURM's are in biasflow.slurm).

``--list-changes params`` (``--list-params-changes``) lists every output file of every job in Snakemake 9.27: a
``ParamsChange`` that holds no change still iterates over the files it looked at (the fix of snakemake/snakemake#3288,
PR #3313, collects the files of unchanged jobs too). Only files whose params really changed are listed here; the
re-run decision, which uses the change's truth value, is untouched. Installed only on the Snakemake code it was
written for (``biasflow.upstream``); the bug and the upstream fix: docs/upstream.md.
"""
from __future__ import annotations


def install() -> None:
    try:
        from snakemake.persistence import ParamsChange
    except ImportError:  # another Snakemake: nothing to fix
        return
    if getattr(ParamsChange, "_biasflow_fixed", False):
        return
    from biasflow.upstream import unchanged_or_warn

    if not unchanged_or_warn("snakemake", "the --list-changes params fix"):
        return

    def changed_files(self):
        return iter(self.files if self else ())

    ParamsChange.__iter__ = changed_files
    ParamsChange._biasflow_fixed = True


__all__ = ["install"]
