"""encoder/fused.py: bf16 linear layers fused by oneDNN give the eager model's vectors; the encoder
falls back to the eager model where the kernels are missing or disagree, and a replaced model
(a query tower's merged weights) is never run through the fused copy of the old one."""
import copy

import pytest
import torch

from relsearch.encoder import fused, model
from test_encoder import cos, texts

SAMPLE = [t[:100] for t in texts(6)] + ["short one", "", "word " * 60]  # bf16 without bf16 units is slow


@pytest.fixture(scope="module")
def bf16_encoder():
    return model.Encoder(model.EncoderConfig(precision="bf16"))


def test_fused_linears_give_the_eager_models_vectors(bf16_encoder, monkeypatch):
    fast = fused.fused_copy(bf16_encoder.model)
    if fast is bf16_encoder.model:
        pytest.skip("this CPU or PyTorch build has no oneDNN bf16 kernels (AVX2-only CPUs): the eager path runs")
    layers = bf16_encoder.model.config.num_hidden_layers
    linears = sum(type(m) is torch.nn.Linear for m in bf16_encoder.model.modules())
    kinds = [m.post_op for m in fast.modules() if isinstance(m, fused.FusedLinear)]
    assert kinds.count("gelu") == layers and kinds.count("none") == linears - layers  # every feed-forward's GELU fused
    assert not any(type(m) is torch.nn.Linear for m in fast.modules())
    assert any(type(m) is torch.nn.Linear for m in bf16_encoder.model.modules())  # the original is untouched
    got = bf16_encoder.encode(SAMPLE).vectors
    assert bf16_encoder._runner() is not bf16_encoder.model
    monkeypatch.setattr(fused, "fused_copy", lambda m: m)  # the eager path, the same weights
    eager = copy.copy(bf16_encoder)
    eager._fast = None
    want = eager.encode(SAMPLE).vectors
    fp32 = model.Encoder(model.EncoderConfig(precision="fp32")).encode(SAMPLE).vectors
    assert cos(got, want).min() >= 0.9995 and cos(got, fp32).min() >= 0.999  # two bf16 roundings


@pytest.mark.parametrize("broken", ["no kernels", "disagrees"])
def test_the_eager_model_runs_where_the_fused_kernel_is_missing_or_wrong(bf16_encoder, monkeypatch, broken):
    if broken == "no kernels":
        monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    else:
        monkeypatch.setattr(fused.FusedLinear, "forward", lambda self, x: torch.zeros(
            (*x.shape[:-1], self.out_features), dtype=x.dtype))
    assert fused.fused_copy(bf16_encoder.model) is bf16_encoder.model


def test_a_replaced_model_is_what_runs(bf16_encoder):
    """encoder/tower.py replaces a shallow copy's model by one with merged weights: the copy must
    run those weights, and the original its own, whatever fused copy either built before."""
    before = bf16_encoder.encode(SAMPLE).vectors
    variant = copy.copy(bf16_encoder)
    variant.model = copy.deepcopy(bf16_encoder.model)
    with torch.no_grad():
        variant.model.encoder.layer[0].intermediate.dense.weight.mul_(-1.0)
    changed = variant.encode(SAMPLE).vectors
    assert cos(changed, before).min() < 0.99
    assert cos(bf16_encoder.encode(SAMPLE).vectors, before).min() >= 0.9999
