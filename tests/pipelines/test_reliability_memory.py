"""Resource bounds: the peak memory of `relsearch index` is set by the chunk (shard) size, not by the
corpus size. Two runs with the same chunk size on corpora of 1 and 16 chunks (5 MB and 80 MB of
input, the bytes mostly in metadata so the model's work stays small) must peak within a margin
far below the 75 MB the larger corpus adds."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from synthetic_index import RELSEARCH

CHUNK = 100
LINE_BYTES = 50_000


def corpus(path, lines: int):
    with open(path, "w") as f:
        for i in range(lines):
            blob = f"{i:08d}" * (LINE_BYTES // 8)  # unique per line: nothing to share or intern
            f.write(json.dumps({"id": f"doc{i}", "text": f"Document {i} about item {i % 97}.", "blob": blob}) + "\n")
    return path


def peak_rss_mb(*args) -> float:
    """Peak resident memory of one `relsearch` process (its own rusage, via wait4)."""
    proc = subprocess.Popen([RELSEARCH, *map(str, args)], env={**os.environ, "HF_HUB_OFFLINE": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    out = proc.stdout.read().decode() + proc.stderr.read().decode()
    assert proc.returncode == 0, out
    return usage.ru_maxrss / 1024


@pytest.mark.slow
def test_peak_memory_is_flat_in_corpus_size(tmp_path):
    small = corpus(tmp_path / "small.jsonl", CHUNK)
    large = corpus(tmp_path / "large.jsonl", 16 * CHUNK)
    added_mb = (large.stat().st_size - small.stat().st_size) / 2**20
    args = ["--chunk-lines", CHUNK, "--quiet"]
    rss_small = peak_rss_mb("index", small, "--index", tmp_path / "a", *args)
    rss_large = peak_rss_mb("index", large, "--index", tmp_path / "b", *args)
    print(f"peak RSS: {rss_small:.0f} MB for 1 chunk, {rss_large:.0f} MB for 16 chunks (+{added_mb:.0f} MB input)")
    assert added_mb > 70
    assert rss_large - rss_small < 25, (rss_small, rss_large)
