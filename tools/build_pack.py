"""Build the default relation pack (``relsearch/pack``) from the shared datasets.

Exact command (repository root, virtual environment active; 2 CPU cores: see MODEL_CARD.md for the
time the last build took)::

    HF_HUB_OFFLINE=1 python tools/build_pack.py --data ../shared/data --out relsearch/pack

It prepares train/dev/test triples for each relation in a temporary folder, trains one ``linear``
operator per relation with :func:`relsearch.encoder.training.train_adapter` (the same function
``relsearch train`` calls) on the default encoder, and writes ``bundle.json``,
``operators.safetensors`` and ``MODEL_CARD.md`` into ``--out`` (written aside, then swapped in).

Relations and their preparation (splits are always the datasets' own):

- ``duplicate-question``  no trained operator: a recipe over identity (the question's cosine, its
                          title's — the first line — and BM25), its weights chosen on the
                          meta_se_dupq train and dev duplicates (both directions) over all 1,875
                          questions of meta_se_dupq/corpus.jsonl, measured on the test duplicates
                          over the same corpus. The linear operator trained on those pairs gained
                          on meta.stackexchange but not on another forum (Qatar Living: −0.004
                          MRR; docs/results.md, "Transfer to other datasets"), so none is used.
- ``qa-entailment``       trecqa/triples; hard negative = a non-answer candidate (label 0) of the
                          same question from trecqa/pairs, spread round-robin over its answers;
                          every training candidate sentence joins its softmax (``candidates``).
                          ``--wikiqa DIR`` (tools/data/wikiqa.py's folder) adds WikiQA's train split,
                          prepared the same way, and chooses the recipe on TrecQA and WikiQA dev
                          pooled; test stays TrecQA's. Not used for the shipped pack: so chosen,
                          the recipe lost TrecQA test (docs/results.md, "qa-entailment on two QA sets").
- ``paraphrase``          msrp/triples, both directions.
- ``same-caption``        flickr8k_captions/triples, both directions, group = image (all 6,000
                          training images unless ``--flickr-train-images`` asks for fewer).
- ``entailment``          sick/triples A→B; hard negative = a contradiction of the same premise.
- ``contradiction``       sick/triples, both directions; hard negative = an entailment of the
                          same premise (A→B direction only).
- ``similar-company``     no trained operator: a recipe over identity (description cosine, BM25 and
                          bonuses for sharing the query company's GICS sub-industry / industry), its
                          weights chosen on the competitors that train and dev companies' own
                          Wikipedia and Bloomberg texts name (relsearch/bench/peers.py,
                          ``competitors=True``), measured on the test companies' competitors. A
                          linear operator trained on mined peers lost to identity on the whole
                          corpus (test MRR 0.093 vs 0.128), so none is used. ``--company-tower
                          BUNDLE`` puts a similar-company query tower there instead (trained with
                          ``relsearch train --regime encoder`` on tools/company_tower_data.py's
                          triples); its recipe is then chosen on dev companies only (the tower has
                          seen the train companies' competitors) and may leave the tower out.

After training, every relation's recipe (what ``--relation NAME`` runs: the operator mixed with
identity, BM25 and metadata bonuses) is chosen on dev by whole-corpus retrieval and measured on
test (relsearch/retrieval/recipe_fit.py); a relation ships only when its recipe beats identity on
test by ``SHIP_MARGIN``. ``--relation R --reuse relsearch/pack`` retrains R only and keeps the
other operators, choosing all recipes again.

A build measures each relation on its own splits only; whether it carries over to a dataset its
recipe never saw is measured afterwards, on the built pack, by ``relsearch bench transfer
--write-pack relsearch/pack`` (bench/transfer.py), which adds each relation's ``transfer`` entry
and the model card's transfer section (a rebuild drops both: they judged the old recipes).

Training: ``linear`` operators, default hyperparameters of ``TrainConfig`` except
``max_candidates=4096`` (sampled softmax above 4,096 texts: same-caption, paraphrase and
similar-company) and one torch thread (much faster than two when the 2 cores are shared).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

SPLITS = ("train", "dev", "test")
SHIP_MARGIN = 0.02  # a relation ships when its recipe's whole-corpus test MRR beats identity by this much
RECIPE_ONLY = ("duplicate-question", "similar-company")  # recipes over plain cosine: no operator is trained

SOURCES = {
    "duplicate-question": {
        "description": "tail is a duplicate of the head question (same question, other wording): a recipe over "
                       "plain cosine of the question and of its title (first line) and BM25, weighted on "
                       "meta.stackexchange duplicates",
        "dataset": "meta_se_dupq — meta.stackexchange duplicate questions (Bogdanova et al., CoNLL 2015)",
        "licence": "CC BY-SA 3.0 (Stack Exchange data dump)",
        "files": "meta_se_dupq/triples/{train,dev,test}.jsonl",
    },
    "qa-entailment": {
        "description": "tail is a sentence that answers the head question",
        "dataset": "trecqa — TrecQA answer-sentence selection (Wang et al., EMNLP-CoNLL 2007; jacana version)",
        "licence": "public domain (derived from TREC questions, per the brmson/dataset-sts README)",
        "files": "trecqa/triples/{train,dev,test}.jsonl; hard negatives from trecqa/pairs/{split}.jsonl",
    },
    "paraphrase": {
        "description": "tail says the same thing as the head (sentential paraphrase)",
        "dataset": "msrp — Microsoft Research Paraphrase Corpus (Dolan & Brockett, IWP 2005)",
        "licence": "Microsoft Research Shared Source License — non-commercial research use only",
        "files": "msrp/triples/{train,dev,test}.jsonl",
    },
    "same-caption": {
        "description": "tail describes the same image as the head caption",
        "dataset": "flickr8k_captions — Flickr8k captions (Hodosh, Young & Hockenmaier, JAIR 2013)",
        "licence": "research use only (distributed by UIUC on request; no open licence stated)",
        "files": "flickr8k_captions/triples/{train,dev,test}.jsonl",
    },
    "entailment": {
        "description": "tail follows from the head sentence (head entails tail)",
        "dataset": "sick — SICK, SemEval-2014 Task 1 (Marelli et al., LREC 2014)",
        "licence": "CC BY-NC-SA 3.0 (non-commercial, share-alike)",
        "files": "sick/triples/{train,dev,test}.jsonl (entailment; contradictions as hard negatives)",
    },
    "contradiction": {
        "description": "tail contradicts the head sentence",
        "dataset": "sick — SICK, SemEval-2014 Task 1 (Marelli et al., LREC 2014)",
        "licence": "CC BY-NC-SA 3.0 (non-commercial, share-alike)",
        "files": "sick/triples/{train,dev,test}.jsonl (contradiction; entailments as hard negatives)",
    },
    "similar-company": {
        "description": "companies that compete with the head company: a recipe over plain cosine of the "
                       "descriptions, BM25 and shared GICS codes, weighted on competitors the companies' own texts name",
        "dataset": "russell3000_companies — Yahoo Finance descriptions + Bloomberg GICS codes "
                   "(github.com/Sivalavida/Text-based-Industry-Classification)",
        "licence": "no licence stated; Yahoo/Bloomberg texts, GICS is an MSCI/S&P classification — "
                   "research/evaluation use only",
        "files": "russell3000_companies/corpus.jsonl (text, name, text_wikipedia, text_bloomberg, GICS codes, split)",
    },
}
# Company operators trained by company_extras(): same data and licence as similar-company.
for _name, _files in (("aspect:sector", "text, gics_sector, split"), ("aspect:industry", "text, gics_industry, split")):
    SOURCES[_name] = dict(SOURCES["similar-company"], files=f"russell3000_companies/corpus.jsonl ({_files})")


def _read(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _both_ways(triples: list[dict]) -> list[dict]:
    out = list(triples)
    for t in triples:
        r = {k: v for k, v in t.items() if k != "negative"}
        out.append(dict(r, head=t["tail"], tail=t["head"]))
    return out


def _triples(data: Path, name: str, split: str) -> list[dict]:
    return _read(data / name / "triples" / f"{split}.jsonl")


def qa_folders(data: Path, wikiqa: Path | None, split: str) -> list[Path]:
    """The answer-selection sets qa-entailment reads for ``split``: TrecQA, and for train and dev
    also WikiQA when ``wikiqa`` is given (test stays TrecQA's: the pack's own figure; WikiQA test is
    ``relsearch bench transfer``'s)."""
    return [data / "trecqa"] + ([wikiqa] if wikiqa is not None and split != "test" else [])


def qa_triples(folder: Path, split: str) -> list[dict]:
    """An answer-selection set's triples (question → answer sentence), each with a hard negative:
    a non-answer candidate (label 0) of the same question from its pairs, spread round-robin over
    the question's answers."""
    qa = _triples(folder.parent, folder.name, split)
    non_answers = defaultdict(list)
    for p in _read(folder / "pairs" / f"{split}.jsonl"):
        if p["label"] == 0:
            non_answers[p["a"]].append(p["b"])
    seen = defaultdict(int)
    for t in qa:
        negs = non_answers.get(t["head"])
        if negs:
            t["negative"] = negs[seen[t["head"]] % len(negs)]
            seen[t["head"]] += 1
    return qa


def prepare(data: Path, *, flickr_train_images: int | None, seed: int, wikiqa: Path | None = None) -> dict:
    """{relation: {split: [triple dicts]}}, plus a note on how each relation was prepared."""
    rng = random.Random(seed)
    out: dict[str, dict[str, list[dict]]] = defaultdict(dict)
    for split in SPLITS:
        out["duplicate-question"][split] = _both_ways(_triples(data, "meta_se_dupq", split))
        out["paraphrase"][split] = _both_ways(_triples(data, "msrp", split))
        out["qa-entailment"][split] = [t for folder in qa_folders(data, wikiqa, split)
                                       for t in qa_triples(folder, split)]

        caps = [dict(t, group=t.pop("image")) for t in _triples(data, "flickr8k_captions", split)]
        if split == "train" and flickr_train_images:
            images = sorted({t["group"] for t in caps})
            keep = set(rng.sample(images, min(flickr_train_images, len(images))))
            caps = [t for t in caps if t["group"] in keep]
        out["same-caption"][split] = _both_ways(caps)

        sick = _triples(data, "sick", split)
        by_premise = defaultdict(lambda: defaultdict(list))
        for t in sick:
            by_premise[t["head"]][t["relation"]].append(t["tail"])
        for rel, other in (("entailment", "contradiction"), ("contradiction", "entailment")):
            triples = [dict(t) for t in sick if t["relation"] == rel]
            for t in triples:
                negs = by_premise[t["head"]][other]
                if negs:
                    t["negative"] = negs[0]
            out[rel][split] = triples if rel == "entailment" else _both_ways(triples)

    return out


def _companies(data: Path) -> list[dict]:
    return [c for c in _read(data / "russell3000_companies" / "corpus.jsonl") if c.get("text")]


def company_corpus(data: Path, splits: tuple[str, ...]):
    """The Russell 3000 corpus as bench companies judges it (relsearch/bench/companies.py
    ``competitor_corpus``): queried by the companies of ``splits`` that have competitors their own
    texts name, with the GICS codes, prominence and mentions the recipe may weigh."""
    from relsearch.bench.companies import competitor_corpus, distinct

    return competitor_corpus(distinct(_companies(data)), splits=splits, mentions=True)


def company_extras(data: Path, *, seed: int, threads: int, cache_dir: str | None) -> dict:
    """Aspect operators (aspect:sector, aspect:industry) trained on Russell 3000 with its
    by-company splits."""
    from relsearch.encoder.training.aspect import AspectConfig, train_aspects

    corpus = data / "russell3000_companies" / "corpus.jsonl"
    operators = {}
    for short, field in (("sector", "gics_sector"), ("industry", "gics_industry")):
        config = AspectConfig(aspects=(field,), split_field="split", seed=seed, threads=threads, cache_dir=cache_dir)
        bundle, _ = train_aspects([str(corpus)], config=config)
        op = bundle.operators[f"aspect:{field}"]
        op.name, op.description = f"aspect:{short}", f"companies in the same GICS {short} (AspectCSE, query side)"
        operators[op.name] = op
    return operators


def train_relations(trained: dict, data: Path, config, encoder, wikiqa: Path | None = None):
    """One linear operator per relation of ``trained`` ({relation: {split: triples}}) in one bundle.
    qa-entailment's softmax also contrasts against every training candidate sentence (answers and
    non-answers): it is judged against all of a split's sentences, as an index of them holds."""
    from relsearch.encoder.training import train_adapter

    bundle = None
    for group, extra in (({r: t for r, t in trained.items() if r != "qa-entailment"}, None),
                         ({r: t for r, t in trained.items() if r == "qa-entailment"},
                          _answer_candidates(data, "train", wikiqa))):
        if not group:
            continue
        with tempfile.TemporaryDirectory(prefix="relsearch-pack-") as tmp:
            files = _write(group, Path(tmp))
            part = train_adapter(files["train"], dev_files=files["dev"], test_files=files["test"], config=config,
                                 encoder=encoder, descriptions={r: SOURCES[r]["description"] for r in group},
                                 candidates=extra)
        if bundle is None:
            bundle = part
        else:
            bundle.operators.update({n: op for n, op in part.operators.items() if n != "identity"})
    return bundle


def fit_recipes(bundle, prepared: dict, data: Path, encoder, cache_dir: str | None,
                wikiqa: Path | None = None) -> dict[str, dict]:
    """Each RSE relation's recipe chosen on dev by whole-corpus retrieval and measured on test
    (retrieval/recipe_fit.py). Text relations: every text of the relation's split is a candidate;
    similar-company: the whole company corpus, peers as gold, GICS codes for the bonuses."""
    from relsearch.encoder.training import encode_cached
    from relsearch.retrieval.recipe_fit import Corpus, fit

    def encode(texts):
        return encode_cached(encoder, texts, cache_dir=cache_dir, progress=False)

    reports = {}  # recipe-only relations: weights only, none learned from the pairs, so train and dev choose
    if "similar-company" in bundle.operators:
        company = bundle.operators["similar-company"]
        # a query tower (--company-tower) was trained on the train companies' competitors: dev alone chooses
        choosing = ("train", "dev") if company.kind == "identity" else ("dev",)
        if company.needs_text:
            from relsearch.encoder.tower import attach_towers

            attach_towers({"similar-company": company}, encoder)
        reports["similar-company"] = fit(company, company_corpus(data, choosing), company_corpus(data, ("test",)),
                                         encode)
    if "duplicate-question" in bundle.operators:  # an index of the forum: every question of the corpus
        forum = [q["text"] for q in _read(data / "meta_se_dupq" / "corpus.jsonl")]
        duplicates = prepared["duplicate-question"]
        dev, test = (Corpus.of_pairs([(t["head"], t["tail"]) for s in splits for t in duplicates[s]], forum)
                     for splits in (("train", "dev"), ("test",)))
        reports["duplicate-question"] = fit(bundle.operators["duplicate-question"], dev, test, encode)
    for name in sorted(set(prepared) - set(RECIPE_ONLY)):  # an index of the split: every tail and negative,
        # for qa-entailment every sentence
        dev, test = (Corpus.of_pairs([(t["head"], t["tail"]) for t in prepared[name][split]],
                                     [x for t in prepared[name][split] for x in (t["tail"], t.get("negative")) if x]
                                     + (_answer_candidates(data, split, wikiqa) if name == "qa-entailment" else []),
                                     heads=name != "qa-entailment")
                     for split in ("dev", "test"))
        reports[name] = fit(bundle.operators[name], dev, test, encode)
    for name, report in sorted(reports.items()):
        print(f"{name}: recipe {report['recipe']}, test {report['test']}", flush=True)
    return reports


def keep_measured(bundle, measured: dict[str, dict]) -> None:
    """Give each reused operator back its ``transfer`` figures (and an aspect its own test, both
    measured by ``relsearch bench transfer``) when the recipe chosen again is the one they measured;
    ``measured``: operator → its earlier ``recipe``, ``whole_corpus`` and ``transfer`` entries."""
    for name, was in measured.items():
        op = bundle.operators.get(name)
        if op is not None and was["transfer"] is not None and same_recipe(op.info.get("recipe"), was["recipe"]):
            op.info["transfer"] = was["transfer"]
            if was["recipe"] is None and was["whole_corpus"] is not None:  # an aspect: no recipe, its own test
                op.info["whole_corpus"] = was["whole_corpus"]


def same_recipe(a: dict | None, b: dict | None) -> bool:
    """Whether two stored recipes rank alike (a part stored as 0, or not stored, is the same)."""
    from relsearch.retrieval.recipe import Recipe

    return a == b or (a is not None and b is not None and Recipe.from_json(a) == Recipe.from_json(b))


def company_tower(path: str, encoder):
    """The ``similar-company`` query tower of the bundle at ``path``, checked against the pack's
    encoder (a tower trained on other weights is refused with one line)."""
    from relsearch.encoder.bundle import load_bundle
    from relsearch.encoder.tower import attach_towers

    op = load_bundle(path).operators.get("similar-company")
    if op is None or op.kind != "encoder":
        raise SystemExit(f"--company-tower {path}: no similar-company query tower (kind encoder) in that bundle")
    op.info.pop("recipe", None)  # chosen again, with the companies' GICS codes, on dev companies
    op.info.pop("whole_corpus", None)
    op.description = SOURCES["similar-company"]["description"]
    try:
        attach_towers({op.name: op}, encoder)
    except ValueError as e:
        raise SystemExit(f"--company-tower {path}: {e}") from None
    return op


def _answer_candidates(data: Path, split: str, wikiqa: Path | None = None) -> list[str]:
    """Every candidate sentence of the split of :func:`qa_folders` (answers and non-answers: TrecQA's
    test 1,393)."""
    return sorted({p["b"] for folder in qa_folders(data, wikiqa, split)
                   for p in _read(folder / "pairs" / f"{split}.jsonl")})


def ship_winners(bundle, reports: dict[str, dict]) -> dict[str, dict]:
    """Drop every relation whose recipe does not beat identity on its whole-corpus test by
    ``SHIP_MARGIN`` MRR; returns the dropped ones' test figures (recorded in the bundle)."""
    dropped = {}
    for name, report in reports.items():
        test = report["test"]
        if test["recipe"] < test["identity"] + SHIP_MARGIN:
            dropped[name] = test
            del bundle.operators[name]
    return dropped


def _write(prepared: dict, folder: Path) -> dict[str, list[str]]:
    files = {s: [] for s in SPLITS}
    for rel, splits in prepared.items():
        for split, triples in splits.items():
            path = folder / f"{rel}.{split}.jsonl"
            with open(path, "w", encoding="utf-8") as f:
                for t in triples:
                    f.write(json.dumps(dict(t, relation=rel), ensure_ascii=False) + "\n")
            files[split].append(str(path))
    return files


def write_pack(bundle, folder: Path, reports: dict[str, dict]) -> None:
    """Save the bundle and its MODEL_CARD.md aside and swap them in (world-readable: it ships inside the package)."""
    from relsearch.encoder.training.card import render_model_card
    from relsearch.encoder.training.loop import write_bundle
    from relsearch.bench.transfer import card_section as transfer_section
    from relsearch.bench.transfer import with_card_section
    from relsearch.retrieval.recipe_fit import card_section

    dropped = "; ".join(f"{name} (recipe {t['recipe']:.3f} vs identity {t['identity']:.3f})"
                        for name, t in sorted(bundle.info.get("dropped", {}).items()))
    card = render_model_card(bundle, title="relsearch default relation pack", notes=[
        f"Built by `python {bundle.info['preparation']}` in {bundle.info['build_seconds']} s wall time on 2 CPU "
        "cores (including the encoding of texts not yet in the vector cache); see tools/build_pack.py for the "
        "preparation." + (f" The operators it did not retrain come from a pack built by `python "
                          f"{bundle.info['reused']['preparation']}` in {bundle.info['reused']['build_seconds']} s."
                          if bundle.info.get("reused") else ""),
        "Symmetric relations (duplicate-question, paraphrase, same-caption, contradiction, similar-company) are "
        "trained and evaluated in both directions; qa-entailment and entailment head → tail only.",
        "A best epoch of 0 means dev MRR never beat the starting point, so the operator is the identity "
        "initialisation (W = I, b = 0).",
        "Operators act on the query side only: indexes built with the encoder above stay valid.",
        "similar-company: trained and judged on peers that the companies' own Wikipedia and Bloomberg texts name "
        "(relsearch/bench/peers.py), with a few same-sub-industry partners as a weak prior; its recipe may add a bonus "
        "for sharing the query company's GICS codes, which needs an index holding those metadata fields and an "
        "`--id` query.",
        "duplicate-question: no trained operator; its recipe's weights (the question's cosine, its title's — the "
        "query's first line, as forum questions are title + body — and BM25) are chosen on meta.stackexchange's "
        "train and dev duplicates over all 1,875 questions of the forum and judged on its test duplicates over the "
        "same questions; a linear operator trained on the same pairs did not carry over to another forum.",
        f"A relation ships only when its recipe beats identity on its whole-corpus test by {SHIP_MARGIN} MRR; "
        f"dropped in this build: {dropped or 'none'}.",
        "aspect:sector / aspect:industry: AspectCSE adapter operators (multi-positive contrastive loss over all training "
        "companies), judged by same-label retrieval over all test companies."])
    card += card_section(reports)
    if any("transfer" in op.info for op in bundle.operators.values()):
        card = with_card_section(card, transfer_section(bundle))
    write_bundle(bundle, folder, card=card)
    for f in folder.iterdir():
        f.chmod(0o644)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="../shared/data", help="folder holding the shared datasets")
    ap.add_argument("--out", default="relsearch/pack", help="bundle folder to (re)write")
    ap.add_argument("--operator", default="linear", choices=("linear", "translation"))
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--flickr-train-images", type=int, default=None, help="subsample the 6,000 training images")
    ap.add_argument("--max-candidates", type=int, default=4096, help="sampled softmax above this many texts")
    ap.add_argument("--threads", type=int, default=1, help="torch threads while training")
    ap.add_argument("--relation", action="append", help="train only these relations (repeatable)")
    ap.add_argument("--reuse", default=None, metavar="PACK",
                    help="with --relation: take the other relations' operators from this pack instead of training "
                         "them (their recipes are chosen again)")
    ap.add_argument("--wikiqa", default=None, metavar="DIR",
                    help="qa-entailment also trains on this WikiQA folder's train split (tools/data/wikiqa.py; "
                         "non-answers as hard negatives) and chooses its recipe on TrecQA and WikiQA dev together")
    ap.add_argument("--cache-dir", default=None, help="vector cache (default ~/.cache/relsearch/vectors)")
    ap.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16"),
                    help="the encoder's (auto: bf16 on a CPU with AVX-512 BF16 or AMX, else fp32); fp32 rebuilds a "
                         "pack built on another CPU without moving recipes by bf16's rounding")
    ap.add_argument("--company-tower", default=None, metavar="BUNDLE",
                    help="similar-company from this bundle's query tower (relsearch train --regime encoder on "
                         "tools/company_tower_data.py's triples) instead of plain cosine; its recipe is chosen on "
                         "dev companies only")
    args = ap.parse_args(argv)
    if args.company_tower and "similar-company" not in (args.relation or ["similar-company"]):
        ap.error("--company-tower replaces similar-company: add --relation similar-company or build every relation")

    from relsearch.encoder.bundle import Bundle, load_bundle
    from relsearch.encoder.model import Encoder, EncoderConfig
    from relsearch.encoder.relations import Operator
    from relsearch.encoder.training import TrainConfig
    from relsearch.encoder.training.card import summary_lines

    t0 = time.time()
    data, out = Path(args.data), Path(args.out)
    wikiqa = Path(args.wikiqa) if args.wikiqa else None
    if wikiqa is not None and not (wikiqa / "pairs" / "train.jsonl").is_file():
        ap.error(f"--wikiqa {wikiqa}: no pairs/train.jsonl there (make it with tools/data/wikiqa.py)")
    prepared = prepare(data, flickr_train_images=args.flickr_train_images, seed=args.seed, wikiqa=wikiqa)
    wanted = set(args.relation or [*prepared, *RECIPE_ONLY])
    trained = {r: prepared[r] for r in prepared if r in wanted and r not in RECIPE_ONLY}
    config = TrainConfig(operator=args.operator, epochs=args.epochs, lr=args.lr, seed=args.seed,
                         max_candidates=args.max_candidates, threads=args.threads, cache_dir=args.cache_dir)
    encoder = Encoder(EncoderConfig(precision=args.precision))
    kept = load_bundle(args.reuse) if args.reuse else None
    bundle = train_relations(trained, data, config, encoder, wikiqa) if trained else None
    if bundle is None and kept is not None:
        bundle = Bundle(encoder=dict(kept.encoder), info=dict(kept.info))
    elif bundle is None:
        ap.error("nothing to train: --relation names no text relation and there is no --reuse pack")
    measured = {}  # a reused operator's transfer figures (and an aspect's own test), valid while its recipe stays
    if kept is not None:
        for name, op in kept.operators.items():
            if name not in bundle.operators and (name in prepared or name in RECIPE_ONLY
                                                 or name.startswith("aspect:")):
                measured[name] = {k: op.info.pop(k, None) for k in ("recipe", "whole_corpus", "transfer")}
                bundle.operators[name] = op
    for name in wanted & set(RECIPE_ONLY):  # a recipe over plain cosine: nothing in it is a trained operator
        bundle.operators[name] = Operator(name=name, kind="identity", description=SOURCES[name]["description"])
    if args.company_tower:
        bundle.operators["similar-company"] = company_tower(args.company_tower, encoder)
    if not args.relation:
        bundle.operators.update(company_extras(data, seed=args.seed, threads=args.threads, cache_dir=args.cache_dir))
    reports = fit_recipes(bundle, {r: prepared[r] for r in prepared if r in bundle.operators}, data, encoder,
                          args.cache_dir, wikiqa)
    earlier = {name: t for name, t in (kept.info.get("dropped", {}) if kept else {}).items() if name not in reports}
    bundle.info["dropped"] = {**earlier, **ship_winners(bundle, reports)}  # a reused pack's drops stay on record
    reports = {r: rep for r, rep in reports.items() if r in bundle.operators}
    keep_measured(bundle, measured)
    for op in bundle.operators.values():  # temp paths mean nothing later: keep the file names only
        for split in op.info.get("data", {}).values():
            if "files" in split:
                split["files"] = [Path(f).name for f in split["files"]]
    bundle.info["sources"] = {r: {k: SOURCES[r][k] for k in ("dataset", "files", "licence")}
                              for r in bundle.operators if r in SOURCES}
    if kept is not None:  # the operators not retrained come from the reused pack's own build
        bundle.info["reused"] = kept.info.get("reused") or {k: kept.info.get(k) for k in ("preparation", "build_seconds")}
    bundle.info["preparation"] = "tools/build_pack.py " + " ".join(sys.argv[1:] if argv is None else argv)
    bundle.info["build_seconds"] = round(time.time() - t0)
    write_pack(bundle, out, reports)
    print("\n".join(summary_lines(bundle)))
    print(f"pack written to {out} in {time.time() - t0:.0f} s; dropped: {', '.join(bundle.info['dropped']) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
