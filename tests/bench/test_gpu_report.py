"""`relsearch bench gpu-report --device cpu --tiny`: the GPU report's dry run, so that the one
command a GPU session runs (docs/gpu-notes.md) cannot rot between the sessions that have a GPU."""
import gzip
import json
from collections import defaultdict
from importlib import resources

from click.testing import CliRunner

from relsearch.cli import cli

from conftest import shared


def tiny_kg(folder):
    """A text knowledge graph in tools/data/codex.py's shape: S&P 500 companies, "same sector as"."""
    rows = [json.loads(line) for line in resources.files("relsearch").joinpath("data/sp500_2017.jsonl")
            .read_text(encoding="utf-8").splitlines()[:60]]
    (folder / "triples").mkdir(parents=True)
    (folder / "entities.jsonl").write_text("".join(json.dumps({"id": r["id"], "text": r["text"][:300]}) + "\n"
                                                   for r in rows))
    by_sector = defaultdict(list)
    for r in rows:
        by_sector[r["gics_sector"]].append(r)
    triples = [{"head": a["text"][:300], "relation": "same sector as", "tail": b["text"][:300], "head_id": a["id"],
                "tail_id": b["id"]} for group in by_sector.values() for a in group for b in group if a is not b]
    for split, part in (("train", triples[::3]), ("dev", triples[1::6]), ("test", triples[4::6])):
        (folder / "triples" / f"{split}.jsonl").write_text("".join(json.dumps(t) + "\n" for t in part))


def test_the_gpu_report_runs_on_the_cpu(tmp_path):
    tiny_kg(tmp_path / "kg")
    data = tmp_path / "report-data"
    packed = CliRunner().invoke(cli, ["bench", "gpu-report-data", "--out", str(data), "--data", str(shared()),
                                      "--kg", str(tmp_path / "kg")])
    assert packed.exit_code == 0, packed.output
    with gzip.open(data / "kg" / "train.tsv.gz", "rt") as f:
        assert f.readline().count("\t") == 2  # by ids: the text triples would not fit one device call
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["bench", "gpu-report", "--device", "cpu", "--tiny", "--data", str(data),
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = (out / "REPORT.md").read_text()
    assert "## bench speed: exit 0" in report and "## query tower: exit 0" in report, report
    assert "sentence-transformers" in report and "MRR" in report  # each step's own figures are in it
    assert json.loads((out / "speed.json").read_text())
    missing = CliRunner().invoke(cli, ["bench", "gpu-report", "--device", "cpu", "--data", str(tmp_path),
                                       "--out", str(out)])
    assert missing.exit_code != 0 and "gpu-report-data" in missing.output
