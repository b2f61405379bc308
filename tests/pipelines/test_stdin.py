"""`relsearch index - --index DIR [--append]`: JSONL from standard input (a subprocess, as a user pipes it)."""
import json
import os
import subprocess

from conftest import DEMO_CORPUS
from synthetic_index import RELSEARCH

ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


def test_index_from_stdin_reconciles_like_a_file(tmp_path):
    lines = DEMO_CORPUS.read_text().splitlines()[:12] + ["{not json", json.dumps({"id": "X1"})]
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("\n".join(lines) + "\n")
    with open(corpus, "rb") as stdin:
        proc = subprocess.run([RELSEARCH, "index", "-", "--index", tmp_path / "idx", "--quiet", "--faiss-index", "Flat"],
                              stdin=stdin, capture_output=True, text=True, env=ENV, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "read 14, indexed 12, rejected 2" in proc.stdout
    rejected = [json.loads(line) for line in (tmp_path / "idx" / "rejected.jsonl").read_text().splitlines()]
    assert [r["line"] for r in rejected] == [13, 14]
    assert not [f for f in os.listdir(tmp_path) if ".stdin-" in f]  # the spooled copy is gone
    empty = subprocess.run([RELSEARCH, "index", "-", "--index", tmp_path / "idx", "--append"], input="",
                           capture_output=True, text=True, env=ENV, timeout=600)
    assert empty.returncode != 0 and "input stdin is empty" in empty.stderr
    assert "Traceback" not in empty.stderr
