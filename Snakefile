# biasflow workflow. Run from the project root:
#   snakemake --cores 2                                  # the default pipeline (conf/config.yaml)
#   snakemake --cores 2 --config overrides='["model=bert_base_uncased"]'
#   snakemake --cores 2 --config multirun=true overrides='["model=a,b","metric.crows_pairs.diff_threshold=0.05,0.1"]'
# or, the same thing:  biasflow run [-m] [hydra overrides...]
# The whole (sweep) plan is built here, at parse time, from the Hydra config: see src/biasflow/plan.py.
import os

# Spinning OpenMP threads steal cores from each other when several jobs share a machine (docs/performance.md);
# it must be set before torch is imported, here and in every stage script this workflow starts.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from biasflow.report.timing import benchmark_file  # every rule's benchmark: record (summed in the run report)
from biasflow.workflow import BUILD_PRIORITY, load_plan
from biasflow.scheduling import score_resources  # per attempt: a retry asks for more
from biasflow.slurm import install as install_slurm_fixes

# On SLURM: every attempt recorded (what it asked for, how it ended), status queries that survive a controller
# outage, no account guessing (src/biasflow/slurm.py)
install_slurm_fixes()

PLAN, W = load_plan(config)
RESULTS = PLAN.paths["results"]
RESOURCES = PLAN.paths["resources"]


localrules: all, aggregate, log_mlflow


# Metric outputs are targets too: Snakemake does not re-create a missing intermediate file whose downstream
# outputs are up to date, and a user who deletes one metric's results expects that metric to be recomputed.
rule all:
    input:
        W.final_target(),
        W.metric_aggregates(),


include: "workflow/rules/data.smk"
include: "workflow/rules/models.smk"
include: "workflow/rules/metrics.smk"
include: "workflow/rules/run.smk"
