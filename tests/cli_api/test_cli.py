"""The installed console script, run as a user would (subprocesses: a few, they are slow)."""
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path


from conftest import DEMO_CORPUS, gen_of, shared

RELSEARCH = shutil.which("relsearch") or str(Path(sys.executable).with_name("relsearch"))
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


def run(*args, check=True):
    proc = subprocess.run([RELSEARCH, *map(str, args)], capture_output=True, text=True, env=ENV, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"relsearch {' '.join(map(str, args))} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def test_index_then_query_json_from_console_script(tmp_path, small_corpus):
    out = run("index", small_corpus, "--index", tmp_path / "idx", "--quiet")
    assert "read 120, indexed 120, rejected 0" in out.stdout
    assert out.stdout.count("encoder: cpu, float32 (fp32: ") + out.stdout.count("encoder: cpu, bfloat16 (bf16: ") == 1
    lines = run("query", "--id", "ADBE", "--index", tmp_path / "idx", "-k", "5", "--json").stdout.splitlines()
    hits = [json.loads(line) for line in lines]
    assert [h["rank"] for h in hits] == [1, 2, 3, 4, 5] and "ADBE" not in {h["id"] for h in hits}
    table = run("query", "video game publisher", "--index", tmp_path / "idx", "-k", "2").stdout
    assert "ATVI" in table and "rank" in table
    bad = run("query", "x", "--index", tmp_path / "idx", "--relation", "no-such-relation", check=False)
    assert bad.returncode != 0 and "available:" in bad.stderr
    bad = run("query", "x", "--index", tmp_path / "idx", "--filter", "colour=red", check=False)
    assert bad.returncode != 0 and "gics_sector" in bad.stderr
    missing = run("index", tmp_path / "nope.jsonl", "--index", tmp_path / "idx2", check=False)
    assert missing.returncode != 0 and "does not exist" in missing.stderr and not (tmp_path / "idx2").exists()


def test_sigkill_mid_run_keeps_previous_index_and_rerun_resumes(tmp_path, small_index):
    """Kill `relsearch index` while it encodes: the old index still answers; the same command
    again resumes from the finished chunks and publishes the complete index."""
    target = tmp_path / "idx"
    shutil.copytree(small_index, target, symlinks=True)
    old = gen_of(target)
    before = run("query", "--id", "ADBE", "--index", target, "-k", "3", "--json").stdout
    captions = shared("flickr8k_captions", "corpus.jsonl").read_text().splitlines()[:2000]
    corpus = tmp_path / "captions.jsonl"
    corpus.write_text("\n".join(captions) + "\n")
    args = ["index", corpus, "--index", target, "--chunk-lines", "100", "--quiet"]
    # the run stops itself once its second shard is written (relsearch/faults.py); then the kill comes from outside
    proc = subprocess.Popen([RELSEARCH, *map(str, args)], env={**ENV, "RELSEARCH_FAULT": "index.shard-written:2:stop"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status = os.waitpid(proc.pid, os.WUNTRACED)
    assert os.WIFSTOPPED(status), f"indexing ended (status {status}) before its second shard"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    finished = len(list((tmp_path / "idx" / "generations").glob("build-*/*.npz")))
    assert finished >= 2
    assert run("query", "--id", "ADBE", "--index", target, "-k", "3", "--json").stdout == before
    assert gen_of(target) == old
    out = run(*args).stdout
    assert f"resumed: {finished} chunks" in out and "read 2000, indexed 2000, rejected 0" in out
    assert "image" in json.loads(run("query", "--index", target, "two dogs play", "-k", "1", "--json").stdout)["metadata"]


def test_relations_and_score_commands():
    rel = run("relations").stdout
    assert "identity" in rel
    scores = json.loads(run("score", "Who wrote Hamlet?", "Shakespeare wrote Hamlet.", "--json").stdout)
    assert "identity" in scores and -1.0 <= scores["identity"] <= 1.0


def test_demo_corpus_is_the_attributed_copy():
    assert sum(1 for _ in DEMO_CORPUS.open()) == 500
    assert "MIT" in (DEMO_CORPUS.parent / "README.md").read_text()


def _plain_cls_model(folder: Path) -> Path:
    """A plain sentence-transformers folder (not a bundle) whose encoder differs from the default
    pack's: the default model's files, linked, with CLS pooling instead of mean."""
    from relsearch.encoder.model import DEFAULT_MODEL, resolve_model_path

    source = Path(resolve_model_path(DEFAULT_MODEL))
    folder.mkdir()
    for f in source.iterdir():
        if f.name != "1_Pooling":
            (folder / f.name).symlink_to(f)
    config = json.loads((source / "1_Pooling" / "config.json").read_text())
    config.update(pooling_mode_cls_token=True, pooling_mode_mean_tokens=False)
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(config))
    return folder


def test_an_index_remembers_the_plain_model_it_was_built_with(tmp_path, small_corpus):
    from click.testing import CliRunner

    from relsearch.cli import cli

    model = _plain_cls_model(tmp_path / "plain")
    corpus, more = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    lines = small_corpus.read_text().splitlines()
    corpus.write_text("\n".join(lines[:20]) + "\n")
    more.write_text("\n".join(lines[20:25]) + "\n")
    target = str(tmp_path / "idx")
    runner = CliRunner()

    def ok(*args):
        out = runner.invoke(cli, list(map(str, args)))
        assert out.exit_code == 0, out.output
        return out.output

    ok("index", corpus, "--index", target, "--model", model, "--quiet")
    manifest = json.loads((Path(gen_of(tmp_path / "idx")) / "manifest.json").read_text())
    assert manifest["bundle"]["ref"] == str(model) and manifest["encoder"]["pooling"] == "cls"
    # no --model: each command uses the index's own model, not the default pack (mean pooling)
    hits = [json.loads(line) for line in ok("query", "--id", "ADBE", "--index", target, "-k", "3", "--json").splitlines()]
    assert len(hits) == 3
    assert ok("relations", "--index", target).startswith(f"bundle: {model}")
    assert "indexed 5" in ok("index", more, "--index", target, "--append", "--quiet")
    assert "ADBE" in ok("query", "software company", "--index", target, "-k", "1")


def test_a_model_that_does_not_exist_fails_in_one_line_and_leaves_nothing(tmp_path, small_corpus, small_index):
    from click.testing import CliRunner

    from relsearch.cli import cli

    commands = [["index", str(small_corpus), "--index", str(tmp_path / "idx")], ["score", "a", "b"],
                ["query", "x", "--index", str(small_index)], ["relations"],
                ["lookup", str(small_corpus), "--index", str(small_index), "--out", str(tmp_path / "out.jsonl")]]
    for args in commands:
        out = CliRunner().invoke(cli, [*args, "--model", "no-such-org/no-such-model"])
        assert out.exit_code == 1, out.output
        assert out.output.splitlines() == ["Error: model 'no-such-org/no-such-model' not found: not a bundle or model "
                                           "folder, not an installed package model, and the Hugging Face hub is "
                                           "offline (HF_HUB_OFFLINE)"], args
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no index, no build folder, no lock


def test_index_progress_moves_per_encoded_batch_and_reaches_the_total(tmp_path, capsys):
    """Below one chunk (2,048 lines) the bar used to sit at 0% until the end: it counts lines per
    encoded batch now, from files, and ends at n/n."""
    import threading

    import numpy as np

    from relsearch.encoder.model import EncodeResult
    from relsearch.pipelines import index as index_job

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "text": f"text {i}"}) + "\n" for i in range(30)) + "not json\n")
    seen = []

    class BatchedStub:
        max_length = 8

        def encode(self, texts, progress=None):
            for start in range(0, len(texts), 7):
                seen.append(index_job.lines_done(tmp_path / "shards"))  # what the bar shows before this batch
                progress(len(texts[start:start + 7]))
            return EncodeResult(np.ones((len(texts), 3), np.float32), 0)

    (tmp_path / "shards").mkdir()
    stop = threading.Event()
    watcher = threading.Thread(target=index_job._watch_progress, args=(tmp_path / "shards", 31, 0, stop))
    watcher.start()
    try:
        [chunk] = index_job.plan_chunks(str(corpus), 2048)
        index_job.encode_chunk(chunk, path=str(corpus), job=index_job.IndexJob(input=str(corpus), index="unused"),
                               encoder=BatchedStub(), shard_dir=tmp_path / "shards")
    finally:
        stop.set()
        watcher.join()
    assert seen == [1, 8, 15, 22, 29]  # the rejected line, then 7 more lines per batch
    assert index_job.lines_done(tmp_path / "shards") == 31
    assert not list((tmp_path / "shards").glob("*.progress"))  # the finished shard replaces its progress
    err = capsys.readouterr().err
    assert "31/31" in err and "indexing" in err
    # issue 28: before the first lines are done (the model loading, ~10 s) the bar says so
    assert err.index("loading the model") < err.index("31/31")


def test_index_progress_reads_a_finished_shard_once(tmp_path, monkeypatch):
    """The bar polls every 0.5 s; it used to read every finished shard's .npz (vectors included)
    at every poll, which grows with the corpus (1.5 GB per poll at a million lines)."""
    import numpy as np

    from relsearch.pipelines import index as index_job
    from relsearch.pipelines import shardfs

    for number, lines in ((0, 2048), (1, 100)):
        np.savez(tmp_path / f"{number:06d}.npz", vectors=np.ones((lines, 4), np.float32), lines=np.int64(lines))
    (tmp_path / "000002.progress").write_text("7")
    reads = []
    real_read = shardfs.read
    monkeypatch.setattr(shardfs, "read", lambda p: reads.append(os.path.basename(p)) or real_read(p))
    finished = {}
    assert [index_job.lines_done(str(tmp_path), finished) for _ in range(3)] == [2155, 2155, 2155]
    assert sorted(r for r in reads if r.endswith(".npz")) == ["000000.npz", "000001.npz"]  # once each
    assert reads.count("000002.progress") == 3  # unfinished: read at every poll
