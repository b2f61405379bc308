"""Why is X not in my top k (issue 52, item 5): its rank in the whole answer and the parts that placed
it there, beside the last hit shown — the same through the Python API, the CLI and score by ids."""
import json

import pytest
from click.testing import CliRunner

from relsearch.api import RequestError, open_index
from relsearch.cli import cli


@pytest.fixture(scope="module")
def index(small_index):
    return open_index(small_index)


def test_why_not_gives_the_rank_and_parts_of_the_whole_answer(index):
    whole = index.search(id="MMM", relations={"similar-company": 1}, k=119, explain=True)
    eighth = whole[7]
    top5 = index.search(id="MMM", relations={"similar-company": 1}, k=5, why_not=eighth.id)
    reason = top5.why_not
    assert [h.id for h in top5] == [h.id for h in whole[:5]]  # asking why changes nothing of the answer
    assert (reason["id"], reason["rank"], reason["of"]) == (eighth.id, 8, len(whole))
    assert reason["score"] == pytest.approx(eighth.score, abs=1e-6)
    assert reason["explain"] == pytest.approx(eighth.explain, abs=1e-6)
    assert sum(v for k, v in reason["explain"].items() if k.startswith("recipe:")) == pytest.approx(eighth.score, abs=1e-5)
    assert reason["cut"]["rank"] == 5 and reason["cut"]["id"] == whole[4].id
    shown = index.search(id="MMM", relations={"similar-company": 1}, k=10, why_not=eighth.id).why_not
    assert shown["rank"] == 8 and "cut" not in shown  # it is shown: nothing kept it out


def test_why_not_says_when_the_query_cannot_return_it(index):
    assert index.search(id="MMM", k=5, why_not="MMM").why_not["rank"] is None  # its own document
    sector = index.search(id="MMM", k=5, filters={"gics_sector": "Energy"}, why_not="ADBE").why_not
    assert sector["rank"] is None and sector["of"] > 0
    with pytest.raises(RequestError) as e:
        index.search(id="MMM", k=5, why_not="NO-SUCH-ID")
    assert e.value.field == "why_not" and "unknown document id" in e.value.message


def test_the_cli_prints_why_not_and_score_by_ids(small_index, index):
    out = CliRunner().invoke(cli, ["query", "--index", str(small_index), "--id", "MMM", "-r", "similar-company",
                                   "-k", "3", "--why-not", "ADBE"])
    assert out.exit_code == 0, out.output
    rank = index.search(id="MMM", relations={"similar-company": 1}, k=3, why_not="ADBE").why_not["rank"]
    assert f"why not ADBE: rank {rank} of" in out.output
    scores = index.score_ids("MMM", "ADBE")
    assert set(scores) == set(index.searcher().bundle.operators)
    for name, s in scores.items():
        alone = index.search(id="MMM", relations={name: 1.0}, k=1, collapse=False, why_not="ADBE").why_not
        assert (s["rank"], s["score"]) == (alone["rank"], alone["score"])
    out = CliRunner().invoke(cli, ["score", "--index", str(small_index), "--id", "MMM", "--id", "ADBE", "--json"])
    assert out.exit_code == 0 and json.loads(out.output) == json.loads(json.dumps(scores)), out.output
    out = CliRunner().invoke(cli, ["score", "--index", str(small_index), "--id", "MMM"])
    assert out.exit_code != 0 and "--id A --id B" in out.output
    with pytest.raises(RequestError):
        index.score_ids("MMM", "MMM")
