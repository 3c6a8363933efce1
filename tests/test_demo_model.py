"""The offline demo model builds from packaged weights and loads as a masked LM and as a next-sentence predictor."""
from __future__ import annotations

import json

import torch


def test_demo_model_builds_and_loads_both_heads(tmp_path):
    from transformers import AutoModelForNextSentencePrediction

    from biasflow.models import load_model
    from biasflow.models.demo import build_demo_mlm

    docs = [["The nurse helped the patient.", "She was kind to everyone."],
            ["The engineer fixed the bridge.", "He worked all night.", "The city thanked him."]] * 4
    info = build_demo_mlm(docs, tmp_path / "demo", {"steps": 2, "batch_size": 4, "max_length": 24, "seed": 0,
                                                    "trainable_layers": 1})
    assert info["demo"] is True and info["sentence_pairs"] == 2 * 3 * 4
    assert json.loads((tmp_path / "demo" / "biasflow_demo.json").read_text())["train"]["steps"] == 2
    mlm = load_model({"name": "demo", "kind": "masked_lm", "path": str(tmp_path / "demo"), "device": "cpu"})
    assert mlm.tokenizer.mask_token == "[MASK]"
    nsp = AutoModelForNextSentencePrediction.from_pretrained(tmp_path / "demo")
    enc = mlm.tokenizer("a b", "c d", return_tensors="pt")
    with torch.inference_mode():
        assert nsp(**enc).logits.shape == (1, 2)


def test_only_the_top_layers_learn(tmp_path):
    """Frozen layers keep the packaged MiniLM weights exactly (they cost no backward pass)."""
    from transformers import BertModel

    from biasflow.models.demo import build_demo_mlm, minilm_dir

    docs = [["One sentence here.", "Another one follows."]] * 8
    build_demo_mlm(docs, tmp_path / "demo", {"steps": 2, "batch_size": 4, "max_length": 16, "lr": 1e-2,
                                             "trainable_layers": 1})
    before = BertModel.from_pretrained(minilm_dir()).state_dict()
    after = BertModel.from_pretrained(tmp_path / "demo").state_dict()
    assert torch.equal(before["encoder.layer.0.attention.self.query.weight"],
                       after["encoder.layer.0.attention.self.query.weight"])
    assert not torch.equal(before["encoder.layer.5.attention.self.query.weight"],
                           after["encoder.layer.5.attention.self.query.weight"])


def test_the_weights_do_not_depend_on_the_threads_of_the_process(tmp_path):
    """Matrix products split their sums by thread, so the trained weights depend on the thread count: the recipe
    fixes it (``model.train.threads``), and a run with more or fewer --cores builds the same model."""
    from safetensors.torch import load_file

    from biasflow.models.demo import build_demo_mlm

    docs = [["The nurse helped the patient after the long operation.", "She was kind to everyone she met."],
            ["The engineer fixed the old bridge over the river.", "He worked all night.", "The city thanked him."]] * 6
    train = {"steps": 3, "batch_size": 8, "max_length": 24, "seed": 0, "trainable_layers": 2, "threads": 2}
    before = torch.get_num_threads()
    try:
        weights = []
        for process_threads in (1, 2):
            torch.set_num_threads(process_threads)
            build_demo_mlm(docs, tmp_path / f"demo{process_threads}", train)
            weights.append(load_file(tmp_path / f"demo{process_threads}" / "model.safetensors"))
    finally:
        torch.set_num_threads(before)
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
