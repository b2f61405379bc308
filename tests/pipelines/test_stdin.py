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


def _spools(folder) -> list[str]:
    return sorted(f for f in os.listdir(folder) if ".stdin-" in f)


def _wait_for_spool(folder, proc, timeout: float = 120) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if [f for f in _spools(folder) if f.endswith(".jsonl")]:  # created, locked, being filled
            return
        time.sleep(0.05)
    raise AssertionError(f"no spool appeared (rc {proc.poll()})")


def test_a_signal_while_stdin_is_copied_leaves_no_spool(tmp_path):
    """SIGINT (Ctrl-C), SIGTERM and SIGHUP while standard input is still being copied: the process
    ends and its `.NAME.stdin-*.jsonl` goes with it (before, the copy had no owner to remove it)."""
    import signal

    line = (json.dumps({"id": "a", "text": "some text"}) + "\n").encode()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        # Ctrl-C reaches a foreground process with SIGINT's default action; a test runner started in the
        # background (CI, nohup) ignores SIGINT, and its children would inherit that
        proc = subprocess.Popen([RELSEARCH, "index", "-", "--index", tmp_path / "idx", "--quiet"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            proc.stdin.write(line * 1000)
            proc.stdin.flush()
            _wait_for_spool(tmp_path, proc)
            proc.send_signal(sig)
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode != 0, sig
        assert _spools(tmp_path) == [], (sig, err)
        assert b"Traceback" not in err, err


def test_sigterm_while_encoding_leaves_no_spool(tmp_path):
    """SIGTERM after the copy, while the job runs (held at a fault point): the spool is removed too."""
    import signal

    corpus = DEMO_CORPUS.read_bytes()
    env = {**ENV, "RELSEARCH_FAULT": "index.shard-written:1:stop"}
    proc = subprocess.Popen([RELSEARCH, "index", "-", "--index", tmp_path / "idx", "--quiet", "--chunk-lines", "100"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        proc.stdin.write(corpus[:corpus.index(b"\n", 60_000) + 1])
        proc.stdin.close()
        _, status = os.waitpid(proc.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status)
        assert len(_spools(tmp_path)) == 1
        os.kill(proc.pid, signal.SIGTERM)
        os.kill(proc.pid, signal.SIGCONT)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _spools(tmp_path) == []


def test_a_killed_runs_spool_is_swept_by_the_next_writer(tmp_path):
    """SIGKILL cannot be handled: the spool stays, unlocked, and the next writer removes it (a live
    run's locked spool is left alone)."""
    import fcntl
    import signal

    from relsearch.indexer import locking, spool

    proc = subprocess.Popen([RELSEARCH, "index", "-", "--index", tmp_path / "idx", "--quiet"],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    try:
        proc.stdin.write(b'{"id": "a", "text": "t"}\n' * 100)
        proc.stdin.flush()
        _wait_for_spool(tmp_path, proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
    stale = _spools(tmp_path)
    assert len(stale) == 1
    with open(tmp_path / ".idx.stdin-live0000.jsonl", "w") as live:  # a running writer's spool
        fcntl.flock(live, fcntl.LOCK_EX)
        with locking.writer_lock(tmp_path / "idx"):  # delete, compact, the API: every writer
            pass
        assert _spools(tmp_path) == [".idx.stdin-live0000.jsonl"]
    assert spool.sweep(tmp_path / "idx") == [tmp_path / ".idx.stdin-live0000.jsonl"]


def test_a_full_disk_while_copying_stdin_is_one_line_and_leaves_no_spool(tmp_path, monkeypatch):
    import errno

    from click.testing import CliRunner

    from relsearch.cli import cli
    from relsearch.indexer import spool

    def fill_up(src, dst, length=0):
        dst.write(src.read(10))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(spool.shutil, "copyfileobj", fill_up)
    out = CliRunner().invoke(cli, ["index", "-", "--index", str(tmp_path / "idx"), "--quiet"],
                             input=b'{"id": "a", "text": "t"}\n' * 10)
    assert out.exit_code == 1 and "No space left on device" in out.output and "nothing was published" in out.output
    assert "Traceback" not in out.output and _spools(tmp_path) == []
