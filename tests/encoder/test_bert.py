"""encoder/bert.py computes what transformers' BertModel computes, and declines what it does not cover."""
import json
import shutil

import torch

from relsearch.encoder import bert
from relsearch.encoder.model import Encoder, EncoderConfig, resolve_model_path
from conftest import demo_texts


def test_plain_bert_equals_transformers_on_a_padded_batch():
    from transformers import AutoModel, AutoTokenizer

    path = resolve_model_path("all-MiniLM-L6-v2")
    config = bert.plain_config(path)
    assert config is not None  # the default encoder is a BERT it covers
    ours, tokenizer = bert.load(path, config, torch.float32)
    theirs = AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    batch = AutoTokenizer.from_pretrained(path)(demo_texts(6) + ["a b"], padding=True, truncation=True,
                                                 max_length=128, return_tensors="pt")
    with torch.inference_mode():
        a = ours(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        b = theirs(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    real = batch["attention_mask"].bool()  # padded positions are never pooled
    assert (a[real] - b[real]).abs().max() < 1e-4
    assert tokenizer.pad_token_id == theirs.config.pad_token_id == 0


def test_what_it_does_not_cover_loads_through_transformers(tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(resolve_model_path("all-MiniLM-L6-v2"), folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "hidden_act": "gelu_new"}))  # tanh GELU
    assert bert.plain_config(str(folder)) is None
    encoder = Encoder(EncoderConfig(model=str(folder), precision="fp32"))
    assert type(encoder.model).__module__.startswith("transformers.")
    (folder / "config.json").write_text(json.dumps(config))
    assert isinstance(Encoder(EncoderConfig(model=str(folder), precision="fp32")).model, bert.BertModel)
