"""Competitors mined from the companies' own texts (relsearch/bench/peers.py): the phrasings the rule
claims are found, and no pair comes from a sentence that does not speak of competition, a ranking
or a shared market."""
import pytest

from relsearch.bench.peers import mine_peers

# made-up names: none is a lower-case word of the texts, each is mentioned from one sector only
NAMES = {"QX": "Quorvex Systems Inc.", "BL": "Blenmark Networks Corp.", "ZT": "Zantiva Devices plc",
         "FD": "Fernholt Foods Company"}
SECTOR = {"QX": "Information Technology", "BL": "Information Technology", "ZT": "Information Technology",
          "FD": "Consumer Staples"}


def corpus(wikipedia_of_qx: str) -> list[dict]:
    rows = [{"id": i, "name": n, "gics_sector": SECTOR[i], "split": "test", "text": f"{n} makes things."}
            for i, n in NAMES.items()]
    rows[0]["text_wikipedia"] = wikipedia_of_qx
    return rows


@pytest.mark.parametrize("sentence", [
    "By 2001 it had a 37% share of the router market, challenging Blenmark's once-dominant position.",
    "It ranks third in the router market, ahead of Blenmark and Zantiva.",
    "It fell behind Blenmark Networks in 2017.",
    "Its software provides routing, similar to tools developed by Blenmark.",
    "Other major router makers include Blenmark Networks.",
    "It lost market share to Blenmark in the 1990s.",
    "The router market is a duopoly of Quorvex and Blenmark.",
    "It is second only to Blenmark in routers.",
    "Its competitors include Blenmark and Zantiva.",
    "It is one of the largest router makers, alongside Blenmark.",
])
def test_each_claimed_phrasing_names_a_competitor(sentence):
    peers = mine_peers(corpus(f"Quorvex was founded in 1990. {sentence} It has 900 employees."), competitors=True)
    assert ("QX", "BL") in peers and ("BL", "QX") in peers


@pytest.mark.parametrize("sentence", [
    "In 2015 Quorvex acquired a division of Blenmark Networks.",  # an acquisition
    "Its customers include Blenmark and Zantiva.",  # customers
    "It was spun off from Blenmark in 2004.",
    "It is headquartered next to the Blenmark tower in Austin.",
])
def test_a_sentence_without_a_cue_gives_no_pair(sentence):
    assert mine_peers(corpus(f"Quorvex makes routers. {sentence}"), competitors=True) == set()
    assert ("QX", "BL") in mine_peers(corpus(f"Quorvex makes routers. {sentence}"))  # a named peer, not a competitor


def test_the_cue_and_the_name_must_share_a_sentence_and_a_sector():
    assert mine_peers(corpus("It gained market share in 2019. In 2020 it bought a plant from Blenmark."),
                      competitors=True) == set()
    assert mine_peers(corpus("It has a 40% market share, ahead of Fernholt Foods."), competitors=True) == set()


def rivals_corpus(tmp_path):
    """A made-up corpus of six pairs of test companies, each naming its rival as a competitor."""
    import json

    products = ["routers", "vaccines", "tankers", "mortgages", "turbines", "sneakers"]
    sectors = ["Information Technology", "Health Care", "Energy", "Financials", "Industrials", "Consumer Discretionary"]
    names = [("Quorvex", "Blenmark"), ("Zantiva", "Fernholt"), ("Ostrava", "Pellucid"), ("Marrowind", "Tescaron"),
             ("Vintrel", "Gaudrix"), ("Sombrel", "Kettaran")]
    rows = []
    for g, (pair, product, sector) in enumerate(zip(names, products, sectors)):
        for m, name in enumerate(pair):
            other = pair[1 - m]
            rows.append({"id": f"{name[:4].upper()}", "name": f"{name} Inc.", "split": "test", "gics_sector": sector,
                         "gics_industry": f"{product} makers", "gics_industry_code": str(g),
                         "gics_sub_industry_code": str(g), "text": f"{name} Inc. designs and sells {product} "
                         f"worldwide through {m + 2} segments.",
                         "text_wikipedia": f"{name} was founded in {1950 + g}. Its competitors include {other}."})
    corpus = tmp_path / "companies.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return corpus


def test_bench_companies_reports_competitors_at_10_and_cross_validated_over_companies(tmp_path):
    """``relsearch bench companies`` on six pairs of competitors: MRR@10 and hits@10 of each method
    on the test companies, and the recipe choice cross-validated over companies (each fold's recipe
    chosen on the other folds' companies)."""
    from relsearch.bench.companies import CompaniesJob, run_companies

    corpus = rivals_corpus(tmp_path)
    res = run_companies(CompaniesJob(corpus=str(corpus), cache_dir=str(tmp_path / "cache"), depth=5, folds=3))
    held_out = {p["method"]: p for p in res.payload["competitors"] if p["gold"] == "competitors"}
    for method in ("identity", "bm25", "hybrid"):
        assert 0 <= held_out[method]["mrr@10"] <= held_out[method]["hits@10"] <= 1
        assert held_out[method]["queries"] == 12 and held_out[method]["pairs"] == 12
    folded = res.payload["competitors_cv"]
    assert [p["method"] for p in folded] == ["identity", "bm25", "hybrid",
                                              "similar-company (recipe chosen on the other folds)"]
    for p in folded:
        assert p["folds"] == 3 and p["queries"] == 12 and len(p["per_fold"]) == 3
        assert p["mrr@10"]["mean"] == pytest.approx(sum(p["per_fold"]) / 3)
    assert len(folded[-1]["fold_recipes"]) == 3
    assert folded[-1]["mrr@10"]["pooled"] == 1.0  # one rival per company, in its own words: found first


def _build_pack():
    import sys
    from pathlib import Path

    tools = Path(__file__).resolve().parents[2] / "tools"
    sys.path.insert(0, str(tools))
    try:
        import build_pack
    finally:
        sys.path.remove(str(tools))
    return build_pack


def test_build_pack_keeps_transfer_figures_only_for_a_recipe_chosen_again_the_same():
    """A rebuild of one relation re-chooses every recipe: a relation whose recipe came out the same
    (a part stored as 0 or not at all is the same) keeps its transfer figures, one whose recipe moved
    loses them, an aspect (no recipe) keeps them and its own test."""
    from relsearch.encoder.bundle import Bundle
    from relsearch.encoder.relations import Operator

    old = {"mixture": {"a": 1.0}, "bm25": 0.1, "same": {"f": 0.5}, "depth": 100}  # stored before newer parts
    again = {**old, "title": 0.0, "prior": {}, "neighbours": 0.0, "prominence": 0.0, "mentions": {}}
    ops = {"a": Operator(name="a", kind="identity", info={"recipe": again}),
           "b": Operator(name="b", kind="identity", info={"recipe": {**again, "bm25": 0.3}}),
           "aspect:x": Operator(name="aspect:x", kind="identity", info={})}
    measured = {name: {"recipe": old if name != "aspect:x" else None, "transfer": {"dataset": name},
                       "whole_corpus": {"test": {"recipe": 0.4}}} for name in ops}
    bundle = Bundle(encoder={}, operators=ops)
    _build_pack().keep_measured(bundle, measured)
    assert ops["a"].info["transfer"] == {"dataset": "a"} and "transfer" not in ops["b"].info
    assert ops["aspect:x"].info == {"transfer": {"dataset": "aspect:x"}, "whole_corpus": {"test": {"recipe": 0.4}}}


def test_build_pack_refuses_a_company_tower_that_is_no_query_tower():
    from pathlib import Path

    build_pack = _build_pack()
    pack = Path(__file__).resolve().parents[2] / "relsearch" / "pack"
    with pytest.raises(SystemExit, match="no similar-company query tower"):
        build_pack.company_tower(str(pack), encoder=None)  # the pack's similar-company is plain cosine


def test_bench_companies_measures_a_company_query_tower_on_competitors(tmp_path, encoder):
    """A bundle whose similar-company is a query tower: the competitor tables read each query
    company's text through it (the vector-only tables leave it out), and the cross-validation runs
    over dev and test companies only (the tower saw the train companies' competitors)."""
    import numpy as np

    from relsearch.bench.companies import CompaniesJob, run_companies
    from relsearch.encoder.bundle import Bundle
    from relsearch.encoder.relations import Operator
    from relsearch.encoder.tower import MARKER
    from relsearch.encoder.training.loop import write_bundle

    rng = np.random.default_rng(0)
    module = "encoder.layer.5.attention.self.query"
    params = {f"{module}.lora_A": rng.normal(0, 0.05, (2, encoder.dim)).astype(np.float32),
              f"{module}.lora_B": rng.normal(0, 0.05, (encoder.dim, 2)).astype(np.float32)}
    tower = Operator(name="similar-company", kind="encoder", params=params, info={"tower": {
        "name": "t", "marker": MARKER, "scale": 4.0, "base": encoder.identity["weights_sha256"]}})
    bundle = tmp_path / "tower"
    write_bundle(Bundle(encoder=dict(encoder.identity), operators={"similar-company": tower}), bundle)
    res = run_companies(CompaniesJob(corpus=str(rivals_corpus(tmp_path)), models=(str(bundle),),
                                     cache_dir=str(tmp_path / "cache"), depth=5, folds=3))
    held_out = {p["method"]: p for p in res.payload["competitors"] if p["gold"] == "competitors"}
    alone, identity = held_out["similar-company (operator alone)"], held_out["identity"]
    assert 0 <= alone["mrr@10"] <= 1 and alone["pairs"] == identity["pairs"] == 12
    assert "similar-company" not in {r["method"] for r in res.payload["rows"]}  # vectors only: no query text
    folded = {p["method"]: p for p in res.payload["competitors_cv"]}
    assert folded["similar-company (operator alone)"]["companies"] == "dev/test"
    assert folded["similar-company (recipe chosen on the other folds)"]["queries"] == 12
