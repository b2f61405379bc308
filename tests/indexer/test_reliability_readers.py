"""Readers during writes: query processes running while the index is appended to, deleted from and
compacted see the old state or the new one, never a mixture, and never fail."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from relsearch.indexer import mutations

from synthetic_index import answers, block, build

PROBE = Path(__file__).parents[1] / "reader_probe.py"


def observations(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")] if path.exists() else []


def test_queries_in_other_processes_see_whole_generations(tmp_path):
    target = tmp_path / "idx"
    build(target, n=10_000)  # large enough that each mutation takes a while (copies, FAISS rewrite)
    expected = {1: answers(target)}
    stop = tmp_path / "stop"
    logs = [tmp_path / f"reader-{i}.jsonl" for i in range(2)]
    readers = [subprocess.Popen([sys.executable, str(PROBE), str(target), str(log), str(stop)]) for log in logs]

    def wait_until_seen(state: int) -> None:
        """Until every reader has answered from generation ``state``, or one failed or exited."""
        hang_guard = time.monotonic() + 600
        while not all(state in {o.get("state") for o in observations(log)} for log in logs):
            if any("error" in o for log in logs for o in observations(log)) or any(r.poll() is not None for r in readers):
                return  # the assertions below say what went wrong
            assert time.monotonic() < hang_guard, f"the readers never answered from generation {state}"
            time.sleep(0.05)

    try:
        wait_until_seen(1)
        steps = [
            lambda: mutations.append(str(target), [block([f"d{i}" for i in range(0, 300)] +  # 300 replaced
                                                         [f"d{i}" for i in range(30_000, 31_000)], seed=3)],
                                     n=1300, run={"read": 1300}),
            lambda: mutations.delete(str(target), [f"d{i}" for i in range(300, 900)]),
            lambda: mutations.append(str(target), [block([f"d{i}" for i in range(40_000, 40_500)], seed=4)],
                                     n=500, run={"read": 500}),
            lambda: mutations.compact(str(target)),
        ]
        for state, step in enumerate(steps, 2):
            step()  # the readers keep opening and querying while this writes and swaps
            expected[state] = answers(target)
            wait_until_seen(state)
    finally:
        stop.touch()
        codes = [r.wait(timeout=120) for r in readers]
    seen = [observations(log) for log in logs]
    errors = [o["error"] for obs in seen for o in obs if "error" in o]
    assert not errors, errors[0]
    assert codes == [0, 0]
    for obs in seen:
        assert {o["state"] for o in obs} == set(expected)  # every generation was queried
        for o in obs:  # and each answer is exactly that generation's: no mixture
            assert [[tuple(hit) for hit in row] for row in o["answers"]] == expected[o["state"]]
    assert expected[2] != expected[1] and expected[3] != expected[2]  # the states differ, so this could fail
