"""Training at the CPU's pace (issue 26): the bf16 choice by probe, gradient caching only where a
batch needs it, one forward per distinct query, and --time-budget for every objective."""
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from relsearch.encoder import precision
from relsearch.encoder.precision import Bf16Choice, bf16_choice, cpu_bf16_flags, matmul_probe
from relsearch.encoder.training import finetune, loop
from relsearch.encoder.training.loop import Budget

from conftest import write_jsonl

PAIRS = [("A cat sits on the mat.", "A cat is sitting on a mat."), ("Dogs run in the park.", "The dogs are running."),
         ("It rains all day.", "Rain is falling."), ("He eats an apple.", "He is eating fruit."),
         ("She sings a song.", "She is singing."), ("The car is red.", "A red automobile.")]


class Probe:
    """A fake matmul probe: fixed (fp32, bf16) seconds; counts its calls."""

    def __init__(self, fp32_s: float, bf16_s: float):
        self.times, self.calls = (fp32_s, bf16_s), 0

    def __call__(self, hidden, ffn):
        self.calls += 1
        return self.times


# ------------------------------------------------------------------------------ bf16 by probe
@pytest.mark.parametrize("flag", ["avx512_bf16", "amx_bf16"])
def test_bf16_is_chosen_where_the_cpu_has_it_and_the_probe_confirms(flag):
    fast, slow = Probe(0.010, 0.003), Probe(0.010, 0.009)
    choice = bf16_choice(384, 1536, flags={flag}, probe=fast)
    assert choice.use and flag in choice.reason and choice.speedup == pytest.approx(10 / 3)
    assert bf16_choice(384, 1536, flags={flag}, probe=fast) is choice and fast.calls == 1  # cached per shapes
    bf16_choice(768, 3072, flags={flag}, probe=fast)
    assert fast.calls == 2  # other shapes, another probe
    refused = bf16_choice(384, 1536, flags={flag}, probe=slow)  # bf16 units, but not faster on these shapes
    assert not refused.use and refused.reason.startswith("fp32") and "1.11x" in refused.reason


def test_without_bf16_instructions_fp32_is_kept_and_nothing_is_probed():
    probe = Probe(0.010, 0.001)
    choice = bf16_choice(384, 1536, flags={"avx2", "avx512f"}, probe=probe)
    assert not choice.use and probe.calls == 0 and "no bf16 instructions" in choice.reason


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    for flags, expected in (("fpu avx2 avx512f avx512_bf16 avx512_vnni", {"avx512_bf16"}),
                            ("fpu avx2 amx_tile amx_bf16 amx_int8", {"amx_bf16"}), ("fpu sse2 avx2 fma", set())):
        info = tmp_path / "cpuinfo"
        info.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
        assert cpu_bf16_flags(str(info)) == expected
    assert cpu_bf16_flags(str(tmp_path / "missing")) == frozenset()


def test_the_real_probe_times_both_dtypes_on_the_given_shapes():
    fp32_s, bf16_s = matmul_probe(32, 64, rows=16, rounds=2)
    assert 0 < fp32_s < 1 and 0 < bf16_s < 1


@pytest.mark.parametrize("use", [True, False])
def test_trainers_and_auto_precision_follow_the_choice(monkeypatch, use):
    seen = []

    def fake_choice(hidden=384, ffn=1536, **kw):
        seen.append((hidden, ffn))
        return Bf16Choice(use, "bf16: fake" if use else "fp32: fake")

    monkeypatch.setattr(finetune, "bf16_choice", fake_choice)
    monkeypatch.setattr(precision, "bf16_choice", fake_choice)
    enc = finetune.TrainableEncoder("all-MiniLM-L6-v2", max_length=8, device="cpu")
    assert seen == [(384, 1536)]  # the model's own widths
    assert enc.autocast_dtype == (torch.bfloat16 if use else torch.float32)
    assert enc.precision == ("bf16" if use else "fp32") and "fake" in enc.precision_reason
    assert finetune.TrainableEncoder("all-MiniLM-L6-v2", max_length=8, device="cpu",
                                     precision="fp32").autocast_dtype == torch.float32
    assert precision.choose_precision("cpu", "auto", cuda_available=False)[1] == (
        torch.bfloat16 if use else torch.float32)


# ------------------------------------------------------------------------------ no replay when a batch fits
def test_a_batch_within_one_chunk_skips_the_replay_with_the_same_gradient(monkeypatch):
    enc = finetune.TrainableEncoder("all-MiniLM-L6-v2", max_length=16, precision="fp32")
    enc.train(False)  # no dropout: the passes compare exactly
    heads, tails = ["a cat sits", "stocks fell", "rain tomorrow"], ["a kitten rests", "markets dropped", "showers"]

    def loss_fn(h, t):
        logits = torch.nn.functional.normalize(h, dim=-1) @ torch.nn.functional.normalize(t, dim=-1).T / 0.05
        return torch.nn.functional.cross_entropy(logits, torch.arange(len(h)))

    calls = []
    real = finetune.TrainableEncoder.forward
    monkeypatch.setattr(finetune.TrainableEncoder, "__call__",
                        lambda self, texts: calls.append(len(texts)) or real(self, texts))
    weight = enc.model.encoder.layer[0].attention.self.query.weight
    finetune.chunked_backward(enc, [heads, tails], loss_fn, chunk=2)  # 6 texts > 2: cached, replayed
    cached, weight.grad = weight.grad.clone(), None
    assert calls == [2, 1, 2, 1, 2, 1, 2, 1]
    calls.clear()
    finetune.chunked_backward(enc, [heads, tails], loss_fn, chunk=6)  # fits: one pass per list
    assert calls == [3, 3]
    torch.testing.assert_close(weight.grad, cached, rtol=1e-4, atol=1e-6)


def test_the_tower_encodes_each_distinct_query_once_per_step(tmp_path, monkeypatch):
    from relsearch.encoder.training.tower import TowerConfig, train_tower

    rows = [{"head": h, "relation": "para", "tail": t} for h, t in PAIRS]
    rows += [{"head": PAIRS[0][0], "relation": "para", "tail": "The mat has a cat on it."}]  # a head with two tails
    data = write_jsonl(tmp_path / "t.jsonl", rows)
    texts = []
    real = finetune.TrainableEncoder.forward
    monkeypatch.setattr(finetune.TrainableEncoder, "__call__",  # the training path (embed() calls forward)
                        lambda self, batch: texts.extend(batch) or real(self, batch))
    bundle = train_tower([data], config=TowerConfig(epochs=1, batch_size=8, max_length=8, progress=False,
                                                    cache_dir=str(tmp_path / "cache")))
    assert len(texts) == 6 and len(set(texts)) == 6  # 7 triples, 6 distinct queries, one step
    assert bundle.operators["para"].info["training"]["steps"] == 1


# ------------------------------------------------------------------------------ time budgets
class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_budget_estimates_the_next_unit_and_counts_earlier_sessions():
    clock = FakeClock()
    budget = Budget(1.0, clock_fn=clock)
    assert budget.allows(with_eval=True) and budget.remaining() == 60
    clock.now += 20
    budget.unit_done(20)
    budget.eval_done(15)
    assert budget.estimate() == 20 and budget.estimate(with_eval=True) == 35
    assert budget.allows(with_eval=True) and not budget.stopped  # 35 <= 40
    clock.now += 10
    assert budget.allows() and not budget.allows(with_eval=True) and budget.stopped  # 20 <= 30 < 35
    assert budget.record() == {"time_budget_minutes": 1.0, "elapsed_seconds": 30.0, "stopped_by_time_budget": True}
    resumed = Budget(1.0, spent=50, clock_fn=clock)
    assert resumed.elapsed() == 50 and resumed.fraction() == pytest.approx(50 / 60)
    unlimited = Budget(None, clock_fn=clock)
    clock.now += 1e9
    assert unlimited.allows(with_eval=True) and unlimited.fraction() == 0.0
    with pytest.raises(ValueError, match="positive"):
        Budget(0)


def _ticking(monkeypatch, clock: FakeClock, seconds_per_step: float):
    """Fake time: every training step (a gradient-cached backward) takes ``seconds_per_step``."""
    monkeypatch.setattr(loop, "clock", clock)
    real = finetune.chunked_backward

    def step(*a, **k):
        clock.now += seconds_per_step
        return real(*a, **k)

    monkeypatch.setattr(finetune, "chunked_backward", step)


def test_tower_stops_at_its_budget_evaluates_the_last_steps_and_keeps_the_best(tmp_path, monkeypatch):
    from relsearch.encoder.training.card import render_model_card
    from relsearch.encoder.training.tower import TowerConfig, train_tower

    clock = FakeClock()
    _ticking(monkeypatch, clock, 10.0)
    data = write_jsonl(tmp_path / "t.jsonl", [{"head": h, "relation": "para", "tail": t} for h, t in PAIRS])
    config = TowerConfig(epochs=3, batch_size=2, max_length=8, progress=False, cache_dir=str(tmp_path / "cache"),
                         time_budget=25 / 60)  # 25 s: two 10-s steps fit, a third would not
    bundle = train_tower([data], dev_files=[data], config=config)
    tr = bundle.operators["para"].info["training"]
    assert tr["steps"] == 2 and tr["stopped_by"] == "time budget" and tr["stopped_by_time_budget"]
    assert tr["time_budget_minutes"] == pytest.approx(25 / 60) and tr["elapsed_seconds"] == 20.0
    assert [(h["step"], h["seconds"]) for h in tr["history"]] == [(0, 0.0), (2, 20.0)]  # the last steps evaluated
    best = max(tr["history"], key=lambda h: h["dev_mrr"])
    assert tr["dev_mrr"] == pytest.approx(best["dev_mrr"], abs=1e-5) and tr["best_step"] == best["step"]
    assert "time_budget" not in bundle.info["config"]  # a run option, not a hyperparameter
    card = render_model_card(bundle)
    assert "## Training runs" in card and "time budget 0.4166" in card and "stopped by time budget" in card
    assert "2 @ 20.0 s:" in card


def test_tower_budget_covers_the_whole_run_across_a_resume(tmp_path, monkeypatch):
    from relsearch.encoder.training.tower import TowerConfig, train_tower

    clock = FakeClock()
    _ticking(monkeypatch, clock, 10.0)
    data = write_jsonl(tmp_path / "t.jsonl", [{"head": h, "relation": "para", "tail": t} for h, t in PAIRS])
    config = TowerConfig(epochs=3, batch_size=2, max_length=8, eval_every=1, progress=False,
                         cache_dir=str(tmp_path / "cache"), time_budget=25 / 60)
    real_save = loop.Checkpoint.save

    def dies_after_the_first(self, progress, *args, **kw):
        real_save(self, progress, *args, **kw)
        raise KeyboardInterrupt

    monkeypatch.setattr(loop.Checkpoint, "save", dies_after_the_first)
    with pytest.raises(KeyboardInterrupt):
        train_tower([data], config=config, out=tmp_path / "out")
    monkeypatch.setattr(loop.Checkpoint, "save", real_save)
    clock.now += 3600  # the hour between the kill and the rerun is not the run's
    bundle = train_tower([data], config=config, out=tmp_path / "out")
    tr = bundle.operators["para"].info["training"]
    assert tr["steps"] == 2 and tr["elapsed_seconds"] == 20.0 and tr["stopped_by"] == "time budget"


def test_joint_stops_at_its_budget_and_records_speed_and_dtype(tmp_path, monkeypatch):
    from relsearch.encoder.training.rse_joint import JointConfig, train_joint

    clock = FakeClock()
    _ticking(monkeypatch, clock, 10.0)
    data = write_jsonl(tmp_path / "t.jsonl", [{"head": h, "relation": "para", "tail": t} for h, t in PAIRS])
    config = JointConfig(epochs=2, batch_size=2, max_length=8, progress=False, cache_dir=str(tmp_path / "cache"),
                         time_budget=0.5)  # 30 s: three 10-s steps
    bundle, _ = train_joint([data], dev_files=[data], config=config)
    tr = bundle.operators["para"].info["training"]
    assert tr["steps"] == 3 and tr["stopped_by"] == "time budget" and tr["history"][-1]["step"] == 3
    assert tr["triples_per_second"] > 0 and tr["precision"] in ("fp32", "bf16")
    assert tr["time_budget_minutes"] == 0.5


def test_cli_time_budget_reaches_every_objective_and_the_card(tmp_path, monkeypatch):
    from relsearch.cli import cli
    from relsearch.encoder.training.registry import TRAINERS

    for name, trainer in TRAINERS.items():  # every objective's config takes the run option
        assert "time_budget" in {f.name for f in __import__("dataclasses").fields(trainer.config_cls)}, name
    data = write_jsonl(tmp_path / "t.jsonl", [{"head": h, "relation": "para", "tail": t} for h, t in PAIRS])
    clock = FakeClock()
    monkeypatch.setattr(loop, "clock", clock)
    out = tmp_path / "adapter"
    result = CliRunner().invoke(cli, ["train", str(data), "--dev", str(data), "--out", str(out), "--epochs", "3",
                                      "--time-budget", "2", "--cache-dir", str(tmp_path / "cache"), "--quiet"])
    assert result.exit_code == 0, result.output
    from relsearch.encoder.bundle import load_bundle

    bundle = load_bundle(str(out))
    tr = bundle.operators["para"].info["training"]
    # the budget is the whole command's: with --dev, training gets 90 %, choosing the recipe the rest
    assert tr["time_budget_minutes"] == pytest.approx(1.8) and tr["epochs_run"] == 3
    assert tr["stopped_by"] in ("epochs", "patience")
    assert bundle.info["time_budget"]["minutes"] == 2 and bundle.info["time_budget"]["relations_fitted"] == 1
    card = (out / "MODEL_CARD.md").read_text()
    assert "time budget 1.8 min" in card and "`--time-budget 2` covers the whole `relsearch train` command" in card
    bad = CliRunner().invoke(cli, ["train", str(data), "--out", str(tmp_path / "x"), "--time-budget", "0"])
    assert bad.exit_code != 0 and "--time-budget" in bad.output


def test_epoch_objectives_stop_before_an_epoch_that_would_not_fit(tmp_path, monkeypatch):
    from relsearch.encoder.training import rse

    clock = FakeClock()
    monkeypatch.setattr(loop, "clock", clock)
    real_dev = rse.link_prediction

    def slow_eval(*a, **k):  # each dev evaluation (one per epoch, plus the start) takes 20 fake seconds
        clock.now += 20
        return real_dev(*a, **k)

    monkeypatch.setattr(rse, "link_prediction", slow_eval)
    data = write_jsonl(tmp_path / "t.jsonl", [{"head": h, "relation": "para", "tail": t} for h, t in PAIRS])
    bundle = rse.train_adapter([data], dev_files=[data], config=rse.TrainConfig(
        epochs=10, patience=100, progress=False, cache_dir=str(tmp_path / "cache"), time_budget=1.5))
    tr = bundle.operators["para"].info["training"]
    # 90 s: the start's evaluation (20 s), then epochs of 20 s while the next still fits
    assert tr["epochs_run"] == 3 and tr["stopped_by"] == "time budget" and tr["elapsed_seconds"] <= 90
    assert [h["seconds"] for h in tr["history"]] == [40.0, 60.0, 80.0]
    assert np.isfinite(tr["dev_mrr"])


# ------------------------------------------------------------------------------ a budget instead of an epoch limit
def _fake_dev(monkeypatch, scores):
    """Dev evaluations read ``scores`` in turn (the last one repeats), each with a tail and a head figure."""
    from relsearch.encoder.training import tower

    seen = iter(scores)
    last = {}

    def dev_scores(self):
        last["v"] = next(seen, last.get("v", scores[-1]))
        return {"dev_mrr": last["v"], "dev_mrr_tail": last["v"] + 0.1, "dev_mrr_head": last["v"] - 0.1}

    monkeypatch.setattr(tower._Run, "dev_scores", dev_scores)


def _tower_run(tmp_path, **config):
    from relsearch.encoder.training.tower import TowerConfig, train_tower

    data = write_jsonl(tmp_path / "t.jsonl", [{"head": h, "relation": "para", "tail": t} for h, t in PAIRS])
    config = TowerConfig(batch_size=2, max_length=8, eval_every=None, progress=False,
                         cache_dir=str(tmp_path / "cache"), **config)  # 6 triples: 3 steps an epoch
    return train_tower([data], dev_files=[data], config=config)


def test_a_budget_without_an_epoch_limit_trains_past_the_default_epochs_while_dev_improves(tmp_path, monkeypatch):
    from relsearch.encoder.training.card import render_model_card, summary_lines

    clock = FakeClock()
    _ticking(monkeypatch, clock, 10.0)
    _fake_dev(monkeypatch, [0.1 * i for i in range(1, 50)])  # dev still rising at every evaluation
    # 100 s of budget, 10-s steps: ten steps, over three epochs of three; the default limit (1 epoch) is lifted
    bundle = _tower_run(tmp_path, epochs=1, patience=2, time_budget=100 / 60, until_budget=True)
    tr = bundle.operators["para"].info["training"]
    assert tr["steps"] == 10 and tr["stopped_by"] == "time budget" and tr["max_epochs"] is None
    assert tr["epochs_run"] == pytest.approx(10 / 3, abs=0.01) and tr["steps_per_epoch"] == 3
    assert [h["step"] for h in tr["history"]] == [0, 3, 6, 9, 10]  # each epoch's end, then the last step
    assert tr["best_step"] == 10 and tr["history"][-1]["dev_mrr_head"] == pytest.approx(tr["dev_mrr"] - 0.1)
    lines = summary_lines(bundle)
    assert any(line.startswith("training stopped by time budget: 10 steps (3.33 epochs), no epoch limit")
               and "(tail " in line and "head " in line and "at step 10" in line for line in lines), lines
    assert "no epoch limit (the time budget and dev patience decide)" in render_model_card(bundle)

    clock.now = 1000.0  # the same run with the epoch limit: it stops after its one epoch, budget left
    _fake_dev(monkeypatch, [0.1 * i for i in range(1, 50)])
    limited = _tower_run(tmp_path, epochs=1, patience=2, time_budget=100 / 60).operators["para"].info["training"]
    assert limited["steps"] == 3 and limited["stopped_by"] == "epochs" and limited["max_epochs"] == 1


def test_a_budget_without_an_epoch_limit_stops_by_patience_once_dev_stops_improving(tmp_path, monkeypatch):
    clock = FakeClock()
    _ticking(monkeypatch, clock, 10.0)
    _fake_dev(monkeypatch, [0.1, 0.2, 0.2, 0.2])  # start, epoch 1 gains, then two evaluations without a gain
    bundle = _tower_run(tmp_path, epochs=1, patience=2, time_budget=60.0, until_budget=True)
    tr = bundle.operators["para"].info["training"]
    assert tr["stopped_by"] == "patience" and tr["steps"] == 9 and tr["best_step"] == 3
    assert tr["elapsed_seconds"] == 90.0 and not tr["stopped_by_time_budget"]  # most of the hour left


def test_until_budget_needs_a_budget_and_lr_decays_by_time_alone():
    from relsearch.encoder.training.tower import TowerConfig, lr_factor

    with pytest.raises(ValueError, match="until_budget needs a time_budget"):
        TowerConfig(until_budget=True)
    assert lr_factor(50, None, 10, 0.25) == 0.75 and lr_factor(5, None, 10, 0.9) == 0.6  # warm-up first
    assert lr_factor(50, None, 10, 1.0) == 0.0


@pytest.mark.parametrize("extra,until", [([], True), (["--epochs", "2"], None)])
def test_cli_lifts_the_epoch_limit_only_for_a_budget_without_epochs(tmp_path, monkeypatch, extra, until):
    from relsearch.cli import cli
    from relsearch.encoder.training import tower

    seen = {}

    def fake_train(train_files, *, config, **kw):
        seen["config"] = config
        raise RuntimeError("stop here")

    monkeypatch.setattr(tower, "train_tower", fake_train)
    data = write_jsonl(tmp_path / "t.jsonl", [{"head": h, "relation": "para", "tail": t} for h, t in PAIRS])
    result = CliRunner().invoke(cli, ["train", str(data), "--regime", "encoder", "--out", str(tmp_path / "b"),
                                      "--time-budget", "5", *extra])
    assert "stop here" in result.output
    config = seen["config"]
    assert config.until_budget is bool(until) and config.epochs == (2 if extra else 3)
    assert config.time_budget == pytest.approx(5, abs=0.01)
    plain = CliRunner().invoke(cli, ["train", str(data), "--regime", "encoder", "--out", str(tmp_path / "b")])
    assert "stop here" in plain.output and seen["config"].until_budget is False and seen["config"].time_budget is None


def test_joint_without_an_epoch_limit_trains_until_its_budget(tmp_path, monkeypatch):
    from relsearch.encoder.training.rse_joint import JointConfig, train_joint

    clock = FakeClock()
    _ticking(monkeypatch, clock, 10.0)
    data = write_jsonl(tmp_path / "t.jsonl", [{"head": h, "relation": "para", "tail": t} for h, t in PAIRS])
    config = JointConfig(epochs=1, batch_size=2, max_length=8, patience=5, progress=False,
                         cache_dir=str(tmp_path / "cache"), time_budget=1.0, until_budget=True)  # 60 s: six steps
    bundle, _ = train_joint([data], dev_files=[data], config=config)
    tr = bundle.operators["para"].info["training"]
    assert tr["steps"] == 6 and tr["stopped_by"] == "time budget" and tr["max_epochs"] is None
    assert [h.get("epoch") for h in tr["history"]] == [None, 1, 2]  # the start, then each epoch's end
