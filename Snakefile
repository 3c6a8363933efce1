# biasflow workflow. Run from the project root:
#   snakemake --cores 2                                  # the default pipeline (conf/config.yaml)
#   snakemake --cores 2 --config overrides='["model=bert_base_uncased"]'
#   snakemake --cores 2 --config multirun=true overrides='["model=a,b","metric.crows_pairs.diff_threshold=0.05,0.1"]'
# or, the same thing:  biasflow run [-m] [hydra overrides...]
# The whole (sweep) plan is composed here, at parse time, from the Hydra config (src/biasflow/plan/), and staged
# under .snakemake/biasflow/plans/; parsing writes nothing under results/ (the run folder's plan.json is a rule's).
import os
import re

# Spinning OpenMP threads steal cores from each other when several jobs share a machine (docs/performance.md);
# it must be set before torch is imported, here and in every stage script this workflow starts.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from biasflow.report import metric_output_paths  # the metric stage's files, named once
from biasflow.report.timing import benchmark_file  # every rule's benchmark: record (summed in the run report)
from biasflow.workflow import BUILD_PRIORITY, load_plan
from biasflow.scheduling import score_resources  # per attempt: a retry asks for more
from biasflow.slurm import install as install_slurm_fixes
from biasflow.snakemake_fixes import install as install_snakemake_fixes

# On SLURM: every attempt recorded (what it asked for, how it ended), status queries that survive a controller
# outage, no account guessing (src/biasflow/slurm.py)
install_slurm_fixes()
install_snakemake_fixes()  # --list-changes params lists only files whose params changed

# a cluster job's parse (remote mode) reads only its own jobs from the staged plan's job store
PLAN, W = load_plan(config, remote=workflow.remote_exec)
RESULTS = PLAN.paths["results"]
RESOURCES = PLAN.paths["resources"]


localrules: all, plan, aggregate, log_mlflow


# Every file the plan's jobs write is a target (downloads aside): Snakemake does not re-create a missing
# intermediate file whose downstream outputs are up to date, and a user who deletes one metric's results or one
# report file expects it back (workflow.Lookups.every_output).
rule all:
    input:
        W.final_target(),
        W.every_output(),


include: "workflow/rules/data.smk"
include: "workflow/rules/models.smk"
include: "workflow/rules/metrics.smk"
include: "workflow/rules/run.smk"
