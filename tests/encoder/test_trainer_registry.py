"""The trainer contract: every objective in TRAINERS builds its config from option values, refuses
options it lacks, applies the shared run options, and returns one TrainResult."""
import dataclasses
import hashlib
import json

import numpy as np
import pytest

from relsearch.cli_train import OBJECTIVES
from relsearch.encoder.model import EncodeResult
from relsearch.encoder.training.card import hyperparameters
from relsearch.encoder.training.options import CONFIG_RUN_FIELDS, RunOptions, TrainData, TrainResult
from relsearch.encoder.training.registry import TRAINERS, UnknownOptions, trainer_for

# the smallest option values each objective's config accepts
MINIMAL = {"aspect": {"aspects": ["sector"]}}


def test_every_cli_objective_and_rse_regime_has_a_trainer():
    assert {trainer_for(o).name for o in OBJECTIVES} == set(OBJECTIVES)
    assert trainer_for("rse", "joint").name == "rse-joint" and trainer_for("rse", "encoder").name == "rse-encoder"
    assert trainer_for("rse", "adapter") is trainer_for("rse") is TRAINERS["rse"]
    with pytest.raises(ValueError, match="unknown objective 'nope'"):
        trainer_for("nope")


@pytest.mark.parametrize("name", sorted(TRAINERS))
def test_config_from_options_and_the_hyperparameter_record(name):
    trainer = TRAINERS[name]
    config = trainer.config(dict(MINIMAL.get(name, {}), seed=5, progress=False))
    assert dataclasses.is_dataclass(config) and config.seed == 5
    record = hyperparameters(config)
    assert record["seed"] == 5 and not set(record) & set(CONFIG_RUN_FIELDS)
    json.dumps(record)  # bundles and checkpoints store it as JSON
    with pytest.raises(UnknownOptions) as e:
        trainer.config(dict(MINIMAL.get(name, {}), no_such_option=1))
    assert e.value.names == ["no_such_option"] and e.value.config_cls is type(config)


@pytest.mark.parametrize("name", sorted(TRAINERS))
def test_run_options_reach_the_config_without_changing_its_record(name):
    config = TRAINERS[name].config(dict(MINIMAL.get(name, {})))
    run = RunOptions(threads=2, cache_dir="/tmp/somewhere", progress=False, device="cpu")
    applied = run.applied_to(config)
    assert applied.threads == 2 and applied.cache_dir == "/tmp/somewhere" and applied.progress is False
    assert getattr(applied, "device", "cpu") == "cpu"
    assert hyperparameters(applied) == hyperparameters(config)
    assert RunOptions().applied_to(config) == config  # unset options leave the objective's defaults


def test_option_spellings_map_onto_config_fields():
    transition = TRAINERS["transition"].config({"lambda_": 0.4, "off_temperature": 0, "relations": ["a"]})
    assert transition.lam == 0.4 and transition.off_temperature is None and transition.relations == ("a",)
    assert TRAINERS["aspect"].config({"aspects": ["x", "y"], "combine": "union"}).aspects == ("x", "y")


class FakeEncoder:
    dim = 16
    identity = {"model": "fake", "pooling": "mean", "max_length": 8, "dim": 16, "weights_sha256": "fake0"}

    def encode(self, texts, *, progress=None):
        rows = [np.random.default_rng(int(hashlib.sha256(t.encode()).hexdigest()[:8], 16)).normal(size=self.dim)
                for t in texts]
        return EncodeResult(np.array(rows, dtype=np.float32).reshape(-1, self.dim), 0)


def test_a_run_through_the_registry_returns_one_train_result(tmp_path, monkeypatch):
    from relsearch.encoder import model

    monkeypatch.setattr(model, "Encoder", lambda config: FakeEncoder())
    rows = [{"head": f"sentence {i}", "relation": "same", "tail": f"the same as sentence {i}"} for i in range(30)]
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    trainer = TRAINERS["transition"]
    config = trainer.config({"epochs": 1, "seed": 3})
    result = trainer.train(TrainData(train=[data], test=[data]),
                           RunOptions(cache_dir=str(tmp_path / "cache"), progress=False), config)
    assert isinstance(result, TrainResult) and result.encoder is None
    op = result.bundle.operators["same"]
    assert op.kind == "linear" and op.info["metrics"]["queries"] == 30
    assert result.bundle.info["config"] == hyperparameters(config) == op.info["hyperparameters"]
    assert "same" in trainer.card(result.bundle, notes=["a note"])
