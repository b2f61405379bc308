"""bench/suite.py: `bench all` runs only what the bundle ships, and its report tables.

A tiny hand-made datasets folder stands in for the shared one: the plan and derived inputs are
checked without encoding anything.
"""
import json

import pytest

from conftest import write_jsonl
from relsearch.bench.report import BenchInputError
from relsearch.bench.suite import (PACK_RELATIONS, Step, SuiteJob, cli_command, companies_table, evalrank_table,
                                   main_table, plan, prepare_inputs, recipe_checks, recipe_lines, run_suite,
                                   shipped_relations)
from relsearch.encoder.bundle import Bundle
from relsearch.encoder.relations import Operator

SHIPPED = ("duplicate-question", "qa-entailment", "same-caption", "contradiction", "similar-company", "aspect:sector",
           "aspect:industry", "identity")  # the default pack since recipes: no paraphrase, no entailment


@pytest.fixture
def data(tmp_path):
    root = tmp_path / "data"
    for rel in ("trecqa/pairs", "msrp/pairs", "sick/pairs", "sick/triples", "flickr8k_captions", "evalrank/queries",
                "russell3000_companies", "sp500_companies"):
        (root / rel).mkdir(parents=True)
    pair = {"a": "a question", "b": "an answer", "label": 1}
    for name in ("trecqa", "msrp", "sick"):
        write_jsonl(root / name / "pairs/test.jsonl", [pair])
    write_jsonl(root / "trecqa/pairs/dev.jsonl", [pair])
    write_jsonl(root / "sick/triples/test.jsonl", [
        {"head": "a man sings", "relation": "entailment", "tail": "a person sings"},
        {"head": "a man sings", "relation": "contradiction", "tail": "nobody sings"},
        {"head": "a dog runs", "relation": "contradiction", "tail": "a dog sleeps"}])
    write_jsonl(root / "flickr8k_captions/corpus.jsonl", [{"text": "a dog", "split": "test"},
                                                          {"text": "a cat", "split": "train"}])
    write_jsonl(root / "evalrank/queries/test.jsonl", [{"query": "q", "positive": "p"}])
    write_jsonl(root / "russell3000_companies/corpus.jsonl", [{"id": "A", "split": "train"}, {"id": "B", "split": "test"}])
    write_jsonl(root / "sp500_companies/corpus.jsonl", [{"id": "A", "split": "test"}, {"id": "C", "split": "test"}])
    return root


def _plan(data, tmp_path, relations):
    inputs = prepare_inputs(data, tmp_path / "out" / "inputs", relations)
    return inputs, {s.name: s for s in plan(data, inputs, SuiteJob(out=str(tmp_path / "out")), relations)}


def test_the_suite_judges_only_the_relations_the_bundle_ships(data, tmp_path):
    shipped, absent = shipped_relations(dict.fromkeys(SHIPPED))
    assert absent == ("paraphrase", "entailment") and set(shipped) == set(SHIPPED) - {"identity"}
    inputs, steps = _plan(data, tmp_path, shipped)
    assert set(steps) == {"linkpred_meta_se_dupq", "linkpred_trecqa", "linkpred_flickr8k_captions", "linkpred_sick",
                          "linkpred_evalrank", "companies_russell3000", "retrieval_russell3000_gics_sector",
                          "retrieval_russell3000_gics_industry", "retrieval_russell3000_gics_sub_industry_code",
                          "retrieval_sp500_gics_sector", "retrieval_flickr8k_image", "sts_stsb", "sts_sick",
                          "sts_sts12_16"}  # no msrp (paraphrase), no GICS-pair link prediction for similar-company
    # SICK without entailment: a test file of the contradiction triples only
    sick = steps["linkpred_sick"].job.test
    assert sick == inputs["sick_test"] and sick != str(data / "sick/triples/test.jsonl")
    assert {t["relation"] for t in map(json.loads, open(sick))} == {"contradiction"}
    assert len(open(sick).read().splitlines()) == 2 and "contradiction" in steps["linkpred_sick"].note
    # EvalRank without paraphrase: identity (and BM25, always) only
    assert steps["linkpred_evalrank"].job.relations == ("identity",)
    assert steps["retrieval_russell3000_gics_sector"].job.relations == ("similar-company", "aspect:sector",
                                                                        "aspect:industry")
    companies = steps["companies_russell3000"]
    assert companies.job.corpus == str(data / "russell3000_companies/corpus.jsonl")
    command = cli_command(companies, tmp_path / "out")
    assert command.startswith(f"relsearch bench companies {data / 'russell3000_companies/corpus.jsonl'} ")
    assert "--model" not in command and "--json" in command


def test_the_full_pack_and_a_single_relation(data, tmp_path):
    inputs, steps = _plan(data, tmp_path, PACK_RELATIONS)
    assert "linkpred_msrp" in steps and steps["linkpred_evalrank"].job.relations == ("paraphrase",)
    assert steps["linkpred_sick"].job.test == str(data / "sick/triples/test.jsonl")  # both SICK relations: as shipped
    _, steps = _plan(data, tmp_path / "one", ("qa-entailment",))
    assert set(steps) == {"linkpred_trecqa", "linkpred_evalrank", "sts_stsb", "sts_sick", "sts_sts12_16"}


def test_a_bundle_with_none_of_the_relations_is_refused(data, tmp_path):
    path = Bundle(encoder={"model": "toy", "dim": 2}).save(tmp_path / "bare")
    with pytest.raises(BenchInputError, match="ships none"):
        run_suite(SuiteJob(out=str(tmp_path / "out"), data=str(data), model=str(path)), echo=lambda *_: None)


def _row(relation, method, mrr, available=True):
    m = {"mrr": mrr, "hits@1": mrr / 2, "hits@3": mrr, "hits@10": mrr}
    return {"relation": relation, "method": method, "direction": "tail", "available": available, "queries": 10,
            "filtered": m, "raw": m}


def test_tables_show_the_recipe_and_survive_a_pack_without_paraphrase():
    rows = [_row(r, m, v) for r in ("contradiction", "overall")
            for m, v in (("bm25", 0.8), ("identity", 0.6), ("relation", 0.9), ("recipe", 0.91), ("hybrid", 0.7))]
    lp = Step("linkpred_sick", "linkpred", "sick", None, result={"rows": rows, "counts": {"candidates": 40}})
    table = main_table([lp])
    assert table.rows[0][table.columns.index("recipe MRR")] == 0.91
    assert table.rows[0][table.columns.index("operator MRR")] == 0.9
    evalrank = Step("linkpred_evalrank", "linkpred", "evalrank", None,
                    result={"rows": [_row("overall", "bm25", 0.5), _row("overall", "identity", 0.4)]})
    labels = {r[0] for r in evalrank_table(evalrank).rows}
    assert "BM25" in labels and "all-MiniLM-L6-v2, plain cosine" in labels
    assert "pack: paraphrase operator" not in labels

    competitors = [{"gold": "competitors", "method": m, "mrr": v, "queries": 13, "candidates": 2851}
                   for m, v in (("identity", 0.13), ("bm25", 0.09), ("hybrid", 0.135),
                                ("similar-company (operator alone)", 0.13),
                                ("similar-company (recipe: 0.3·minmax(1·similar-company) + 0.7·minmax(bm25))", 0.21))]
    comp = Step("companies_russell3000", "companies", "russell3000_companies", None,
                result={"competitors": competitors})
    t = companies_table(comp)
    assert t.rows == [["competitors", 13, 2851, 0.13, 0.09, 0.135, 0.21, pytest.approx(0.08)]]

    ops = {"identity": Operator(name="identity", kind="identity"),
           "similar-company": Operator(name="similar-company", kind="identity", info={
               "recipe": {"mixture": {"similar-company": 1.0}, "bm25": 0.7},
               "whole_corpus": {"test": {"identity": 0.130, "recipe": 0.208, "queries": 13, "candidates": 2851}}}),
           "contradiction": Operator(name="contradiction", kind="identity", info={
               "recipe": {"mixture": {"contradiction": 1.0}},
               "whole_corpus": {"test": {"identity": 0.7, "recipe": 0.65, "queries": 10, "candidates": 40}}})}
    checks = {c["relation"]: c for c in recipe_checks(Bundle(encoder={"model": "toy", "dim": 2}, operators=ops),
                                                      [lp, comp])}
    assert checks["similar-company"]["beats_identity"] and not checks["contradiction"]["beats_identity"]
    assert checks["similar-company"]["this_run"]["recipe"] == 0.21 and checks["contradiction"]["this_run"]["recipe"] == 0.91
    lines = "\n".join(recipe_lines(list(checks.values())))
    assert "similar-company: the recipe beats identity" in lines and "contradiction: the recipe does not beat" in lines
