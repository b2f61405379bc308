"""CLI wiring of the Elasticsearch backend against tests/es_server.py: index → mirror → query round trip
whose ES results equal the FAISS backend's, per-backend rejections reconciled, mutations re-mirror."""
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from relsearch.cli import cli
from relsearch.indexer.reader import open_index

from es_server import EsTestServer
from conftest import gen_of


@pytest.fixture(scope="module")
def server():
    with EsTestServer(lifetime_s=600) as srv:
        yield srv


@pytest.fixture(scope="module")
def mirrored(tmp_path_factory, small_corpus, server):
    """The small real corpus indexed through the CLI with an Elasticsearch mirror; one item refused."""
    server.fail_item("ABBV", 400, times=1, reason="scripted rejection")
    target = tmp_path_factory.mktemp("es") / "idx"
    out = CliRunner().invoke(cli, ["index", str(small_corpus), "--index", str(target), "--quiet",
                                   "--es-url", server.url, "--es-index", "companies", "--es-index-type", "flat"])
    assert out.exit_code == 0, out.output
    return target, out.output


def run(*args):
    out = CliRunner().invoke(cli, [str(a) for a in args])
    assert out.exit_code == 0, out.output
    return [json.loads(line) for line in out.output.splitlines() if line.startswith("{")]


def test_index_mirrors_with_reconciled_counts_and_alias(mirrored, server):
    target, output = mirrored
    manifest = open_index(target).manifest
    es = manifest.backends["elasticsearch"]
    assert (es["read"], es["indexed"], es["rejected"]) == (120, 119, 1) == (manifest.counts.documents, 119, 1)
    rejected = [json.loads(line) for line in (Path(gen_of(target)) / "rejected-es.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rejected] == ["ABBV"] and "scripted rejection" in rejected[0]["reason"]
    assert server.aliases["companies"] == {es["index"]} and es["index"].startswith("companies-")
    assert "elasticsearch: companies -> companies-" in output and "rejected 1" in output


@pytest.mark.parametrize("query", [
    ["--id", "ADBE"],
    ["--id", "BAC", "--relation", "identity=0.75"],  # a non-unit mixture vector (a relation given twice is refused)
    ["--id", "AAPL", "--filter", "gics_sector=Information Technology"],
    ["video game publisher"],
])
def test_es_backend_returns_what_faiss_returns(mirrored, server, query):
    target, _ = mirrored
    base = ["query", *query, "--index", target, "-k", "5", "--json"]
    faiss_hits = [h for h in run(*base) if h["id"] != "ABBV"][:4]  # ABBV was refused by the mirror
    es_hits = [h for h in run(*base, "--backend", "es", "--es-url", server.url, "--es-index", "companies")][:4]
    assert [h["id"] for h in es_hits] == [h["id"] for h in faiss_hits]
    assert [h["score"] for h in es_hits] == pytest.approx([h["score"] for h in faiss_hits], abs=1e-5)
    assert es_hits[0].keys() == faiss_hits[0].keys()  # same output format


def test_hybrid_and_client_fusion(mirrored, server):
    target, _ = mirrored
    args = ["query", "bank holding company", "--index", target, "-k", "5", "--json", "--backend", "es",
            "--es-url", server.url, "--es-index", "companies", "--hybrid"]
    server_side, client_side = run(*args), run(*args, "--fusion", "client")
    assert len(server_side) == 5 and [h["id"] for h in server_side] == [h["id"] for h in client_side]
    out = CliRunner().invoke(cli, ["query", "x", "--index", str(target), "--backend", "es", "--es-url", server.url,
                                   "--es-index", "companies", "--nprobe", "3"])
    assert out.exit_code != 0 and "FAISS backend" in out.output
    out = CliRunner().invoke(cli, ["query", "x", "--index", str(target), "--backend", "es"])
    assert out.exit_code != 0 and "--es-url" in out.output


SHIPPED = ("similar-company", "duplicate-question", "qa-entailment", "same-caption", "contradiction", "identity")


@pytest.mark.parametrize("relation", SHIPPED)
def test_es_backend_runs_each_shipped_relation_as_the_local_index_does(mirrored, server, relation):
    """The query plan takes kNN and BM25 candidates from Elasticsearch and ranks them with the same
    fusion code: a recipe (BM25 share, GICS bonuses) gives the local top 10 on the mirror too. The
    server scores BM25 itself, so a recipe's scores differ from the local index's by up to ~2e-3:
    two hits within 5e-3 of each other may come in either order (in a bf16-built index BDX and
    AKAM, 3e-5 apart for AAPL's same-caption, swapped)."""
    target, _ = mirrored
    for query in (["--id", "BAC"], ["--id", "AAPL"], ["cloud software and services for enterprises"]):
        base = ["query", *query, "--index", target, "-k", "11", "--json", "--relation", relation]
        local = {h["id"]: h["score"] for h in run(*base) if h["id"] != "ABBV"}  # ABBV was refused by the mirror
        es = CliRunner().invoke(cli, [*base, "--backend", "es", "--es-url", server.url, "--es-index", "companies"])
        assert es.exit_code == 0 and "not its recipe" not in es.output, es.output
        hits = [json.loads(line) for line in es.output.splitlines() if line.startswith("{")][:10]
        for hit, (want, score) in zip(hits, list(local.items())[:10]):
            assert hit["id"] == want or abs(local.get(hit["id"], -1.0) - score) < 5e-3, (query, hit["id"], want)


def test_delete_remirrors_and_swaps_the_alias(tmp_path, small_index, server):
    import shutil

    target = tmp_path / "idx"  # a private copy of the small index, so other tests keep theirs; in the
    shutil.copytree(gen_of(small_index), tmp_path / "gen")  # old layout, a link to a generation elsewhere:
    target.symlink_to(tmp_path / "gen")  # the delete migrates it to one folder
    es = ["--es-url", server.url, "--es-index", "mirror"]
    ids = tmp_path / "ids.txt"
    ids.write_text("ADBE\n")
    out = CliRunner().invoke(cli, ["delete", "--index", str(target), "--ids", str(ids), *es])
    assert out.exit_code == 0, out.output
    first = open_index(target).manifest.backends["elasticsearch"]
    assert first["indexed"] == 119 and server.aliases["mirror"] == {first["index"]}
    out = CliRunner().invoke(cli, ["compact", "--index", str(target), *es])
    assert out.exit_code == 0, out.output
    second = open_index(target).manifest.backends["elasticsearch"]
    assert server.aliases["mirror"] == {second["index"]} and first["index"] not in server.indices  # old one deleted
    hits = run("query", "--id", "AAPL", "--index", target, "-k", "119", "--json", "--backend", "es", *es)
    assert len(hits) == 118 and "ADBE" not in {h["id"] for h in hits}
    ids.write_text("AAPL\n")
    out = CliRunner().invoke(cli, ["delete", "--index", str(target), "--ids", str(ids)])  # no mirror this time
    assert open_index(target).manifest.backends["elasticsearch"]["stale"] is True
    before = gen_of(target)
    out = CliRunner().invoke(cli, ["delete", "--index", str(target), "--ids", str(ids)])  # nothing left to delete
    assert "no new generation published" in out.output and gen_of(target) == before


@pytest.mark.elasticsearch
@pytest.mark.skipif(not os.environ.get("RELSEARCH_TEST_ES_URL"), reason="set RELSEARCH_TEST_ES_URL to run")
def test_recipes_on_a_real_server_give_the_local_top_10(tmp_path, small_corpus):
    """Bounded end to end against a reachable Elasticsearch (120 documents, one index, deleted after):
    every shipped relation's top 10 as the local index answers, up to near-ties that Lucene's
    one-byte length norms may swap (at most one of ten)."""
    import uuid

    from relsearch.indexer.elastic import connect, delete_index

    url, name = os.environ["RELSEARCH_TEST_ES_URL"], f"relsearch-test-{uuid.uuid4().hex[:12]}"
    es = ["--es-url", url, "--es-index", name]
    target = tmp_path / "idx"
    out = CliRunner().invoke(cli, ["index", str(small_corpus), "--index", str(target), "--quiet", *es,
                                   "--es-index-type", "flat"])
    try:
        assert out.exit_code == 0, out.output
        for relation in SHIPPED:
            base = ["query", "--id", "BAC", "--index", target, "-k", "10", "--json", "--relation", relation]
            local, remote = [[h["id"] for h in run(*base, *extra)] for extra in ((), ("--backend", "es", *es))]
            assert len(set(local) & set(remote)) >= 9, (relation, local, remote)
    finally:
        client = connect(url, ca_certs=os.environ.get("RELSEARCH_TEST_ES_CA_CERTS"))
        for index in client.indices.get_alias(name=name):
            delete_index(client, index)


def test_a_filter_matching_nothing_warns_on_es_as_locally(mirrored, server):
    """A filter no document matches: no hits and the local index's warning (with the stored
    spelling of a value that differs only in case), not a crash."""
    target, _ = mirrored
    base = ["query", "--id", "AAPL", "--index", str(target), "-k", "5", "--json", "--filter", "gics_sector=energy"]
    for extra in ((), ("--backend", "es", "--es-url", server.url, "--es-index", "companies")):
        out = CliRunner().invoke(cli, [*base, *extra])
        assert out.exit_code == 0, out.output
        assert "no document matches the filter" in out.output and "gics_sector='Energy' does" in out.output
        assert not [line for line in out.output.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("query", [
    ["--id", "AAPL", "--relation", "similar-company"],
    ["bank holding company", "--relation", "similar-company", "--filter", "gics_sector=Financials"],
    ["--id", "BAC", "--relation", "similar-company=0.6", "--relation", "duplicate-question=0.4"],  # a mixture
])
def test_es_backend_gives_the_local_top_5(mirrored, server, query):
    """A relation (its recipe), a filtered text query and a mixture: the same top 5 from the mirror."""
    target, _ = mirrored
    base = ["query", *query, "--index", target, "-k", "6", "--json"]
    local = [h["id"] for h in run(*base) if h["id"] != "ABBV"][:5]  # ABBV was refused by the mirror
    es = [h["id"] for h in run(*base, "--backend", "es", "--es-url", server.url, "--es-index", "companies")][:5]
    assert len(local) == 5 and es == local


def test_es_backend_knows_its_one_text_field(mirrored, server):
    target, _ = mirrored
    es = ["--backend", "es", "--es-url", server.url, "--es-index", "companies"]
    assert run("query", "--id", "AAPL", "--index", target, "-k", "3", "--json", "--field", "text", *es)
    out = CliRunner().invoke(cli, ["query", "--id", "AAPL", "--index", str(target), "--field", "summary", *es])
    assert out.exit_code != 0 and "unknown text field 'summary'" in out.output and "text" in out.output


def test_es_backend_refuses_an_index_of_several_text_fields():
    from types import SimpleNamespace

    from relsearch.retrieval.es_backend import EsQueryOptions, EsSearcher
    from relsearch.retrieval.search import QueryError

    local = SimpleNamespace(text_fields=("text", "wiki"), metadata_fields=())
    with pytest.raises(QueryError, match="one text field; this index has text, wiki: query it with the local"):
        EsSearcher(local, EsQueryOptions(url="http://unused:9200", index="x"), client=object())
    local.text_fields = ("text",)
    assert EsSearcher(local, EsQueryOptions(url="http://unused:9200", index="x"), client=object()).text_fields == ("text",)


def test_both_backends_are_what_the_recipe_search_takes(small_index):
    """retrieval/backend.py: the local index and Elasticsearch answer candidates the same way."""
    from relsearch.retrieval.backend import Backend
    from relsearch.retrieval.es_backend import EsQueryOptions, EsSearcher
    from relsearch.retrieval.search import Searcher

    local = Searcher(str(small_index))
    assert isinstance(local, Backend)
    assert isinstance(EsSearcher(local, EsQueryOptions(url="http://unused:9200", index="x"), client=object()), Backend)
