"""Options whose mapping order changes the numbers (LPBS group 1 vs group 2, LangFair's COBS groups) keep the order
the user wrote through the plan file, its hashes and the stages (plans sort dict keys)."""
from __future__ import annotations

import numpy as np
import pytest

from biasflow.data.templates import load_lpbs
from biasflow.errors import ConfigError
from biasflow.metrics.langfair import group_lists
from biasflow.plan import Plan, build_plan
from biasflow.registry import get_metric
from biasflow.scoring.answer import metric_answers
from biasflow.registry import metric_options_from


def _saved_job(tmp_path, overrides, metric):
    """The job as a stage sees it: planned, written to plan.json and read back."""
    plan = build_plan([f"metric=[{metric}]", *overrides])
    path = plan.write(str(tmp_path / f"plan-{plan.plan_hash}.json"))
    return next(j for j in Plan.read(path).jobs if j.metric == metric)


def _lpbs_values(job, tiny_bert, cache):
    items = load_lpbs({}, job.benchmark_cfg)
    items = items[items.attribute.isin(["nurse", "developer", "kind", "ceo"])].reset_index(drop=True)
    cfg = dict(job.metric_cfg, run_mode=job.mode)
    scores = metric_answers("lpbs", items, cfg, dict(tiny_bert.cfg, batch_tokens=64), cache, model=tiny_bert)
    per = get_metric("lpbs").compute(items, scores, metric_options_from("lpbs", cfg))
    return items, per["value"].to_numpy()


def test_lpbs_targets_keep_the_written_order(tiny_bert, tmp_path):
    default = _saved_job(tmp_path, [], "lpbs")
    written = _saved_job(tmp_path, ["benchmark.lpbs.targets={male:[he],female:[she]}"], "lpbs")
    swapped = _saved_job(tmp_path, ["benchmark.lpbs.targets={female:[she],male:[he]}"], "lpbs")
    # the order is part of the job's identity: the swapped groups are another job with other numbers
    assert len({written.metric_dir, swapped.metric_dir, default.metric_dir}) == 3
    assert written.items_path != swapped.items_path

    items_d, v_default = _lpbs_values(default, tiny_bert, tmp_path / "cache")
    items_w, v_written = _lpbs_values(written, tiny_bert, tmp_path / "cache")
    items_s, v_swapped = _lpbs_values(swapped, tiny_bert, tmp_path / "cache")
    assert (items_w["group_1"] == "male").all() and (items_s["group_1"] == "female").all()
    assert (items_d["group_1"] == "male").all()
    assert np.abs(v_default).min() > 0
    np.testing.assert_array_equal(v_written, v_default)  # the default, spelled out: the same numbers
    np.testing.assert_allclose(v_swapped, -v_default, rtol=0, atol=1e-12)  # swapped: every sign flips


def test_list_form_is_accepted_and_equals_the_mapping(tmp_path):
    as_map = _saved_job(tmp_path, ["benchmark.lpbs.targets={male:[he,him],female:[she]}"], "lpbs")
    as_list = _saved_job(tmp_path, ["benchmark.lpbs.targets=[{male:[he,him]},{female:[she]}]"], "lpbs")
    assert as_map.benchmark_cfg["targets"] == [{"male": ["he", "him"]}, {"female": ["she"]}]
    assert as_map.metric_dir == as_list.metric_dir


def test_langfair_groups_keep_the_written_order(tmp_path):
    job = _saved_job(tmp_path, ["metric.langfair_stereotype.groups={male:langfair_male,female:langfair_female}"],
                     "langfair_stereotype")
    assert list(group_lists(job.metric_cfg["groups"])) == ["male", "female"]
    other = _saved_job(tmp_path, ["metric.langfair_stereotype.groups={female:langfair_female,male:langfair_male}"],
                       "langfair_stereotype")
    assert list(group_lists(other.metric_cfg["groups"])) == ["female", "male"]
    assert job.metric_dir != other.metric_dir


def test_a_group_given_twice_is_an_error():
    with pytest.raises(ConfigError, match="'male' is given twice"):
        load_lpbs({}, {"targets": [{"male": ["he"]}, {"male": ["him"]}]})
