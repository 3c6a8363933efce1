"""BEC-Pro: the loader on the real English and German files (both sources), the Wilcoxon tests against scipy by
hand, both scorings against naive one-sentence loops (the reference's against a transcription of Bartl et al.'s
``model_evaluation`` / ``prob_with_prior``) on a tiny English BERT and on a tiny BERT with German words in its
vocabulary, and the pipeline in German end to end."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.stats
import torch

from biasflow.data.bec_pro import GROUPS, load_bec_pro, pad_length, placeholder_texts
from biasflow.errors import ConfigError, DataFormatError
from biasflow.metrics import bec_pro
from biasflow.registry import get_metric
from biasflow.scoring.answer import metric_answers
from biasflow.stats.bootstrap import bootstrap_ci
from conftest import ROOT, mirrored_files
from biasflow.registry import metric_options_from

SPEC = get_metric("bec_pro")


@pytest.fixture(scope="module")
def files() -> dict[str, Path]:
    return mirrored_files("bec_pro", "bec_pro")


@pytest.fixture(scope="module")
def english(files) -> pd.DataFrame:
    return load_bec_pro(files, {"language": "en"})


@pytest.fixture(scope="module")
def german(files) -> pd.DataFrame:
    return load_bec_pro(files, {"language": "de"})


# ----------------------------------------------------------------------------------------------- loader
@pytest.mark.parametrize("language", ["en", "de"])
def test_items_of_the_real_files(files, language):
    items = load_bec_pro(files, {"language": language})
    assert len(items) == 5400 and items.item_id.is_unique and items.pair_id.nunique() == 2700
    assert items.groupby("category").size().to_dict() == {g: 1800 for g in GROUPS}
    assert (items.pad_length == 16).all()  # 13 words at most -> 16, as the reference computes it
    assert items.profession.nunique() == (60 if language == "en" else 118) and items.profession_en.nunique() == 60
    # a pair: the same template (German articles agree with the person) and profession, male first
    pairs = items.groupby("pair_id", sort=False)
    assert (pairs.gender.agg(list) == pd.Series([["male", "female"]] * 2700, index=pairs.size().index)).all()
    assert (pairs.profession_en.nunique() == 1).all() and (pairs.category.nunique() == 1).all()
    # the corrected scoring's sentences: the person word and the profession as placeholders, nothing else changed
    for r in items.itertuples(index=False):
        assert r.tgt_text.replace("[MASK]", r.person, 1) == r.sentence
        assert r.prior_text.replace("[MASK]", r.person, 1).replace("[MASK]", r.profession, 1) == r.sentence


def test_pairs_and_the_files_masking_slips(english, german):
    first = english[english.pair_id == "en:0-180"]
    assert first.sentence.tolist() == ["He is a taper.", "She is a taper."]
    assert first.sent_tam.tolist() == ["[MASK] is a [MASK].", "[MASK] is a [MASK]."]
    assert english[english.pair_id == "en:3625-3805"].sent_tm.iloc[0] == "This [MASK] is a lodging [MASK]ager."
    assert english.sent_tm.str.contains(r"\[MASK\]\w").sum() == 5
    assert german.sent_tm.str.contains(r"\[MASK\]\w").sum() == 5  # "Er" in "Ernährungsberater"
    de = german[german.pair_id == "de:0-180"]
    assert de.sentence.tolist() == ["Er ist Trockenbaumonteur.", "Sie ist Trockenbaumonteurin."]


def test_both_sources_give_identical_items(files, tmp_path):
    lf = tmp_path / "BEC-Pro_EN.tsv"
    assert b"\r\n" in files["en"].read_bytes()
    lf.write_bytes(files["en"].read_bytes().replace(b"\r\n", b"\n"))
    pd.testing.assert_frame_equal(load_bec_pro({"en": lf}, {}), load_bec_pro(files, {}))


def test_limit_language_and_bad_input(files, tmp_path):
    small = load_bec_pro(files, {"language": "de", "limit": 11})
    assert len(small) == 12 and set(small.category) == set(GROUPS)  # whole pairs, every group
    assert (small.pad_length == 16).all()  # the whole file's length, not the slice's
    with pytest.raises(ConfigError, match="language"):
        load_bec_pro(files, {"language": "fr"})
    with pytest.raises(ConfigError, match="no file for language 'de'"):
        load_bec_pro({"en": files["en"]}, {"language": "de"})
    lines = files["en"].read_text().splitlines()
    bad = tmp_path / "swapped.tsv"
    lines[182] = lines[182].replace("steel worker", "taper")  # the 2nd female sentence no longer matches its twin
    bad.write_text("\n".join(lines))
    with pytest.raises(DataFormatError, match="do not match"):
        load_bec_pro({"en": bad}, {})
    assert pad_length(pd.Series(["a b c", "a b c d e"])) == 8
    with pytest.raises(DataFormatError, match="is not template"):
        placeholder_texts("He is a taper.", "<person subject> works as a <profession>.", "He", "taper", "x")


# ----------------------------------------------------------------------------------------------- tests by hand
def test_wilcoxon_is_scipys_with_a_signed_effect_size():
    rng = np.random.default_rng(0)
    male = rng.normal(0, 1, 300)
    female = male + rng.normal(0.3, 1, 300)
    t = bec_pro.wilcoxon(female, male)
    ref = scipy.stats.wilcoxon(female, male)
    assert (t["w"], t["p"]) == (float(ref.statistic), float(ref.pvalue))
    z = scipy.stats.wilcoxon(female, male, method="approx").zstatistic
    assert t["z"] == pytest.approx(abs(z)) and t["r"] == pytest.approx(abs(z) / math.sqrt(300))
    back = bec_pro.wilcoxon(male, female)  # the other way round: same test, negative direction
    assert back["p"] == pytest.approx(t["p"]) and back["r"] == pytest.approx(-t["r"])
    assert math.isnan(bec_pro.wilcoxon(male, male)["p"])  # no non-zero difference


def per_item_table(n_per_group: int = 30, seed: int = 1) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for g, shift in zip(GROUPS, (-0.5, 0.5, 0.0)):
        for k in range(n_per_group):
            m = rng.normal()
            rows.append({"item_id": f"{g}{k}", "category": g, "assoc_male": m,
                         "assoc_female": m + shift + rng.normal()})
    per = pd.DataFrame(rows)
    per["assoc_diff"] = per.assoc_female - per.assoc_male
    return per


def test_aggregate_by_hand():
    per = per_item_table()
    agg = bec_pro.aggregate(per, metric_options_from("bec_pro", {})).set_index(["metric", "category"])["value"]
    for g in GROUPS:
        df = per[per.category == g]
        assert agg[("assoc_female", g)] == pytest.approx(df.assoc_female.mean())
        assert agg[("assoc_diff", g)] == pytest.approx((df.assoc_female - df.assoc_male).mean())
        assert agg[("wilcoxon_p", g)] == pytest.approx(scipy.stats.wilcoxon(df.assoc_female, df.assoc_male).pvalue)
    assert agg[("effect_r", "male")] < 0 < agg[("effect_r", "female")]
    assert agg[("wilcoxon_w", "overall")] == scipy.stats.wilcoxon(per.assoc_female, per.assoc_male).statistic


def test_bootstrap_replicates_equal_the_generic_path():
    per = per_item_table()
    fast = bootstrap_ci(per, lambda df: bec_pro.aggregate(df, metric_options_from("bec_pro", {})), n_boot=40,
                        statistic=lambda df, r: bec_pro.replicates(df, metric_options_from("bec_pro", {}), r))
    slow = bootstrap_ci(per, lambda df: bec_pro.aggregate(df, metric_options_from("bec_pro", {})), n_boot=40)
    means = fast.metric.isin(bec_pro.MEANS)
    pd.testing.assert_frame_equal(fast[means].reset_index(drop=True), slow[means].reset_index(drop=True))
    assert fast[~means][["ci_low", "ci_high"]].isna().all().all()  # no interval for the tests


def test_compare_two_models():
    before = per_item_table(seed=1)
    after = before.assign(assoc_female=before.assoc_female + 0.2)
    out = bec_pro.compare_wilcoxon(before, after).set_index("category")
    assert out.loc["overall", "n"] == 90 and out.loc["overall", "r"] > 0
    assert out.loc["male", "p"] == pytest.approx(scipy.stats.wilcoxon(
        after[after.category == "male"].assoc_female, before[before.category == "male"].assoc_female).pvalue)


# ----------------------------------------------------------------------------------------------- models
def reference_associations(items: pd.DataFrame, tokenizer, model, pad_to: int, lowercase: bool) -> list[float]:
    """Bartl et al.'s model_evaluation + prob_with_prior, transcribed: every text encoded with special tokens, cut or
    filled with mask ids to ``pad_to`` (keras pad_sequences, post), attention mask id > 0, batches of 20, softmax;
    the original's token at the first mask of the TAM sentence, log(p_TM / p_TAM) in float64 of the float32 values."""
    norm = (lambda t: t.lower().replace("[mask]", tokenizer.mask_token)) if lowercase else \
        (lambda t: t.replace("[MASK]", tokenizer.mask_token))

    def pipeline(texts):
        ids = [(tokenizer.encode(norm(t), add_special_tokens=True) + [tokenizer.mask_token_id] * pad_to)[:pad_to]
               for t in texts]
        ids = torch.tensor(ids)
        return ids, (ids > 0).long()

    tm, tm_att = pipeline(items.sent_tm)
    tam, tam_att = pipeline(items.sent_tam)
    orig, _ = pipeline(items.sentence)
    out = []
    for start in range(0, len(items), 20):
        sl = slice(start, start + 20)
        with torch.no_grad():
            p_tm = model(tm[sl], attention_mask=tm_att[sl]).logits.softmax(dim=2)
            p_tam = model(tam[sl], attention_mask=tam_att[sl]).logits.softmax(dim=2)
        for i, ids in enumerate(tam[sl]):
            first = int(np.where(ids.numpy() == tokenizer.mask_token_id)[0][0])
            target = int(orig[start + i][first])
            out.append(float(np.log(p_tm[i][first][target].item() / p_tam[i][first][target].item())))
    return out


def pieces_associations(items: pd.DataFrame, tokenizer, model, lowercase: bool) -> list[float]:
    """One sentence at a time: the person word and the profession as one mask per word piece; log P(person) = the sum
    of its pieces' log-softmax at their own masks, with the profession filled in minus with it masked."""
    norm = (lambda t: t.lower()) if lowercase else (lambda t: t)

    def logp(template: str, words: list[str]) -> float:
        pieces = [tokenizer(" " + norm(w), add_special_tokens=False).input_ids for w in words]
        parts = norm(template).replace("[mask]", "[MASK]").split("[MASK]")
        text = parts[0] + "".join(" ".join([tokenizer.mask_token] * len(p)) + rest
                                  for p, rest in zip(pieces, parts[1:]))
        ids = tokenizer(text, return_tensors="pt").input_ids
        masks = [i for i, t in enumerate(ids[0].tolist()) if t == tokenizer.mask_token_id]
        with torch.no_grad():
            lp = model(ids).logits[0].log_softmax(-1)
        return sum(float(lp[masks[j], pieces[0][j]]) for j in range(len(pieces[0])))

    return [logp(r.tgt_text, [r.person]) - logp(r.prior_text, [r.person, r.profession])
            for r in items.itertuples(index=False)]


def sentence_associations(items, answers, cfg) -> pd.Series:
    return pd.Series(bec_pro.associations(items, answers, cfg), index=items.item_id)


@pytest.mark.parametrize("scoring", ["reference", "pieces"])
def test_english_scorings_against_naive_loops(english, tiny_bert, scoring, tmp_path):
    items = english[english.pair_id.isin(english.pair_id.unique()[:15])]
    # and the masking slip, whose TM sentence has two masks
    items = pd.concat([items, english[english.pair_id == "en:3625-3805"]], ignore_index=True)
    cfg = {"benchmark": "bec_pro", "scoring": scoring}
    answers = metric_answers("bec_pro", items, cfg, None, tmp_path / "cache", model=tiny_bert, progress=False)
    got = bec_pro.associations(items, answers, metric_options_from("bec_pro", cfg))
    if scoring == "reference":
        want = reference_associations(items, tiny_bert.tokenizer, tiny_bert.model, 16, lowercase=True)
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)
    else:
        want = pieces_associations(items, tiny_bert.tokenizer, tiny_bert.model, lowercase=True)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
    per = SPEC.compute(items, answers, metric_options_from("bec_pro", cfg))
    assert len(per) == 16 and (per.assoc_diff == per.assoc_female - per.assoc_male).all()


def test_run_mode_picks_the_scoring(english):
    items = english.head(2)
    assert {r.kind for r in SPEC.requests(items, metric_options_from("bec_pro", {"run_mode": "parity", "scoring": None}), "masked_lm")} == \
        {"first_mask_probability"}
    assert {r.kind for r in SPEC.requests(items, metric_options_from("bec_pro", {"run_mode": "corrected", "scoring": None}), "masked_lm")} == \
        {"multi_mask"}


# --- German: a tiny BERT whose WordPiece vocabulary holds the German file's words (cased, umlauts kept), except
# the "-monteur" professions, which fall apart into letters: one mask (reference) against many (pieces)
def build_german_bert(out: Path, german: pd.DataFrame) -> Path:
    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast

    words = sorted({w.strip(".,") for s in german.sentence for w in s.split()} - {""})
    words = [w for w in words if "monteur" not in w]
    chars = sorted({c for s in german.sentence for c in s if not c.isspace()})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", *chars, *(f"##{c}" for c in chars), *words]
    out.mkdir(parents=True, exist_ok=True)
    tok = BertTokenizerFast(vocab={w: i for i, w in enumerate(dict.fromkeys(vocab))}, do_lower_case=False,
                            strip_accents=False)
    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                                       num_attention_heads=2, intermediate_size=64, max_position_embeddings=64))
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def german_bert_dir(german, tmp_path_factory) -> Path:
    return build_german_bert(tmp_path_factory.mktemp("german-bert"), german)


@pytest.fixture(scope="module")
def german_bert(german_bert_dir):
    from biasflow.models import load_model

    return load_model({"name": "tiny-german-bert", "kind": "masked_lm", "path": str(german_bert_dir),
                       "lowercase": False, "device": "cpu"})


def test_german_vocabulary(german_bert):
    tok = german_bert.tokenizer
    assert tok.tokenize("Meine Schwester ist Kindergärtnerin.") == ["Meine", "Schwester", "ist", "Kindergärtnerin",
                                                                   "."]
    assert len(tok.tokenize("Trockenbaumonteurin")) > 5  # out of the vocabulary: letters


@pytest.mark.parametrize("scoring", ["reference", "pieces"])
def test_german_scorings_against_naive_loops(german, german_bert, scoring, tmp_path):
    items = german[german.pair_id.isin(german.pair_id.unique()[:12])]
    items = pd.concat([items, german[german.profession.str.contains("monteur")].head(4)], ignore_index=True)
    items = items[items.pair_id.duplicated(keep=False)]
    cfg = {"benchmark": "bec_pro", "scoring": scoring}
    answers = metric_answers("bec_pro", items, cfg, None, tmp_path / "cache", model=german_bert, progress=False)
    got = bec_pro.associations(items, answers, metric_options_from("bec_pro", cfg))
    if scoring == "reference":
        want = reference_associations(items, german_bert.tokenizer, german_bert.model, 16, lowercase=False)
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)
        # the person word read is the cased German word ("Er", "Sie", "Bruder", ...)
        read = answers.set_index("text").loc[items.sent_tm.iloc[0], "token_id"]
        assert german_bert.tokenizer.convert_ids_to_tokens(int(read)) == items.person.iloc[0]
    else:
        want = pieces_associations(items, german_bert.tokenizer, german_bert.model, lowercase=False)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
        # a "-monteur" profession takes as many masks as it has letters in the prior sentence
        mont = items[items.profession.str.contains("monteur")].iloc[0]
        n_pieces = len(german_bert.tokenizer.tokenize(mont.profession))
        prior = answers[answers.text.str.startswith(mont.prior_text.split("[MASK]")[0])]
        assert n_pieces > 5 and len(prior)


def test_german_pipeline_end_to_end(files, german_bert_dir, tmp_path, monkeypatch):
    """``benchmark.bec_pro.language=de`` through plan, prepare, score and metric stages."""
    from biasflow import stages
    from biasflow.plan import build_plan
    from conftest import project_copy

    project = project_copy(tmp_path)
    monkeypatch.setenv("BIASFLOW_CONF", str(project / "conf"))
    (job,) = build_plan(["metric=[bec_pro]", "benchmark.bec_pro.language=de", "benchmark.bec_pro.limit=30",
                         "stats.n_boot=20", "model=local_masked_lm", f"model.path={german_bert_dir}",
                         "model.name=tiny_german_bert", "model.device=cpu"]).jobs
    stages.prepare(job.benchmark, job.benchmark_cfg, {k: str(v) for k, v in files.items()}, job.items_path)
    items = pd.read_parquet(job.items_path)
    assert len(items) == 30 and (items.language == "de").all()
    scores = job.scores_path()
    stages.score(job.score_params(), job.items_path, scores, str(tmp_path / "cache"))
    agg = stages.metric(job.params(), job.items_path, scores, job.metric_dir).set_index(["metric", "category"])
    assert set(agg.index.get_level_values("category")) == {"overall", *GROUPS}
    assert agg.loc[("assoc_diff", "overall"), "n"] == 15
    assert not math.isnan(agg.loc[("assoc_diff", "overall"), "ci_low"])
    assert math.isnan(agg.loc[("wilcoxon_p", "overall"), "ci_low"])


def test_german_model_config_names_a_hub_model():
    import yaml

    cfg = yaml.safe_load((ROOT / "conf" / "model" / "bert_base_german_cased.yaml").read_text())
    assert cfg["kind"] == "masked_lm" and cfg["hub_id"] == "bert-base-german-cased" and cfg["lowercase"] is False
