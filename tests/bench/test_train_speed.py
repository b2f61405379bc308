"""bench train-speed runs the project's trainer and the hand loop on the same triples (behaviour only)."""
import pytest
from click.testing import CliRunner

from relsearch.bench import train_speed

from conftest import write_jsonl

PAIRS = [("A cat sits on the mat.", "A cat is sitting on a mat."), ("Dogs run in the park.", "The dogs are running."),
         ("It rains all day.", "Rain is falling."), ("He eats an apple.", "He is eating fruit."),
         ("She sings a song.", "She is singing."), ("The car is red.", "A red automobile."),
         ("Birds fly south.", "The birds migrate."), ("Snow covers the hill.", "The hill is white with snow.")]


@pytest.mark.parametrize("regime", ["encoder", pytest.param("joint", marks=pytest.mark.slow)])
def test_trainer_and_hand_loop_train_the_same_triples_and_the_ratio_is_theirs(tmp_path, regime):
    data = write_jsonl(tmp_path / "t.jsonl", [{"head": h, "relation": "para", "tail": t} for h, t in PAIRS])
    r = train_speed.run(regime=regime, train=data, dev=data, triples=8, dev_triples=4, batch_size=4, max_length=8,
                        cache_dir=str(tmp_path / "cache"))
    assert r["triples"] == 8 and r["dev_triples"] == 4 and r["steps"] == 2 and r["precision"] in ("fp32", "bf16")
    assert r["trainer_per_s"] > 0 and r["hand_per_s"] > 0 and len(r["hand_seconds"]) == 2
    assert r["ratio"] == pytest.approx(r["trainer_per_s"] / r["hand_per_s"])
    assert r["trainer_loop_seconds"] > 0 and r["trainer_cpu_seconds"] > 0 and r["cpu_ratio"] > 0
    table = train_speed.format_table(r)
    assert f"regime {regime}" in table and "ratio trainer / hand loop" in table
    assert ("meets" if r["ratio"] >= 0.7 else "below") in table


def test_bench_train_speed_refuses_bad_input_in_one_line(tmp_path):
    from relsearch.cli_bench import bench

    data = write_jsonl(tmp_path / "t.jsonl", [{"head": h, "relation": "para", "tail": t} for h, t in PAIRS])
    result = CliRunner().invoke(bench, ["train-speed", str(data), "--batch-size", "64"])
    assert result.exit_code == 1 and "fewer than one batch of 64" in result.output and "Traceback" not in result.output
    with pytest.raises(ValueError, match="unknown regime"):
        train_speed.run(regime="adapter", train=data)
