"""Build the default relation pack (``relsearch/pack``) from the shared datasets.

Exact command (repository root, virtual environment active; 2 CPU cores: see MODEL_CARD.md for the
time the last build took)::

    HF_HUB_OFFLINE=1 python tools/build_pack.py --data ../shared/data --out relsearch/pack

It prepares train/dev/test triples for each relation in a temporary folder, trains one ``linear``
operator per relation with :func:`relsearch.encoder.training.train_adapter` (the same function
``relsearch train`` calls) on the default encoder, and writes ``bundle.json``,
``operators.safetensors`` and ``MODEL_CARD.md`` into ``--out`` (written aside, then swapped in).

Relations and their preparation (splits are always the datasets' own):

- ``duplicate-question``  meta_se_dupq/triples, both directions.
- ``qa-entailment``       trecqa/triples; hard negative = a non-answer candidate (label 0) of the
                          same question from trecqa/pairs, spread round-robin over its answers.
- ``paraphrase``          msrp/triples, both directions.
- ``same-caption``        flickr8k_captions/triples, both directions, group = image (all 6,000
                          training images unless ``--flickr-train-images`` asks for fewer).
- ``entailment``          sick/triples A→B; hard negative = a contradiction of the same premise.
- ``contradiction``       sick/triples, both directions; hard negative = an entailment of the
                          same premise (A→B direction only).
- ``similar-company``     russell3000_companies/corpus.jsonl (Yahoo description, GICS
                          sub-industry code, its ``split`` field): ordered pairs of distinct
                          companies of one split sharing a sub-industry, group = sub-industry, so
                          no company crosses splits. Train keeps ``--company-partners`` random
                          partners per company (the group mask removes the unsampled ones from the
                          softmax); dev and test keep every pair. sp500_companies is not used: 153
                          of its 475 tickers shared with russell3000 sit in a different split there.

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

SOURCES = {
    "duplicate-question": {
        "description": "tail is a duplicate of the head question (same question, other wording)",
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
        "description": "tail describes a company in the same GICS sub-industry as the head company",
        "dataset": "russell3000_companies — Yahoo Finance descriptions + Bloomberg GICS codes "
                   "(github.com/Sivalavida/Text-based-Industry-Classification)",
        "licence": "no licence stated; Yahoo/Bloomberg texts, GICS is an MSCI/S&P classification — "
                   "research/evaluation use only",
        "files": "russell3000_companies/corpus.jsonl (text, gics_sub_industry_code, split)",
    },
}
# Company operators trained by company_extras(): same data and licence as similar-company.
for _name, _files in (("aspect:sector", "text, gics_sector, split"), ("aspect:industry", "text, gics_industry, split"),
                      ("similar-company-pu", "text, gics_industry_code, split → labelled pairs")):
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


def prepare(data: Path, *, flickr_train_images: int | None, company_partners: int, seed: int) -> dict:
    """{relation: {split: [triple dicts]}}, plus a note on how each relation was prepared."""
    rng = random.Random(seed)
    out: dict[str, dict[str, list[dict]]] = defaultdict(dict)
    for split in SPLITS:
        out["duplicate-question"][split] = _both_ways(_triples(data, "meta_se_dupq", split))
        out["paraphrase"][split] = _both_ways(_triples(data, "msrp", split))

        qa = _triples(data, "trecqa", split)
        non_answers = defaultdict(list)
        for p in _read(data / "trecqa" / "pairs" / f"{split}.jsonl"):
            if p["label"] == 0:
                non_answers[p["a"]].append(p["b"])
        seen = defaultdict(int)
        for t in qa:
            negs = non_answers.get(t["head"])
            if negs:
                t["negative"] = negs[seen[t["head"]] % len(negs)]
                seen[t["head"]] += 1
        out["qa-entailment"][split] = qa

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

        out["similar-company"][split] = _company_pairs(data, split, company_partners if split == "train" else None, rng)
    return out


def _company_pairs(data: Path, split: str, partners: int | None, rng: random.Random) -> list[dict]:
    groups = defaultdict(list)
    for c in _read(data / "russell3000_companies" / "corpus.jsonl"):
        if c["split"] == split and c.get("text") and c.get("gics_sub_industry_code"):
            groups[str(c["gics_sub_industry_code"])].append(c)
    triples = []
    for code, members in sorted(groups.items()):
        for c in members:
            others = [o for o in members if o["id"] != c["id"] and o["text"] != c["text"]]
            if partners is not None and len(others) > partners:
                others = rng.sample(others, partners)
            triples += [{"head": c["text"], "relation": "similar-company", "tail": o["text"], "group": code}
                        for o in others]
    return triples


def company_pairs(data: Path, split: str, partners: int, rng: random.Random) -> list[dict]:
    """PU pairs: each company with ``partners`` same-GICS-industry companies (label 1) and as many from
    other industries (label 0), all within one split."""
    rows = [c for c in _read(data / "russell3000_companies" / "corpus.jsonl")
            if c["split"] == split and c.get("text") and c.get("gics_industry_code")]
    by_industry = defaultdict(list)
    for c in rows:
        by_industry[str(c["gics_industry_code"])].append(c)
    pairs = []
    for c in rows:
        same = [o for o in by_industry[str(c["gics_industry_code"])] if o["text"] != c["text"]]
        other = [o for o in rows if str(o["gics_industry_code"]) != str(c["gics_industry_code"])]
        for o in rng.sample(same, min(partners, len(same))):
            pairs.append({"a": c["text"], "b": o["text"], "label": 1})
        for o in rng.sample(other, partners):
            pairs.append({"a": c["text"], "b": o["text"], "label": 0})
    return pairs


def company_extras(data: Path, folder: Path, *, label_fraction: float, seed: int, threads: int,
                   cache_dir: str | None) -> tuple[dict, dict]:
    """Aspect operators (aspect:sector, aspect:industry) and the PU variant (similar-company-pu + pu-head),
    all trained on Russell 3000 with its by-company splits. Returns (operators, heads)."""
    from relsearch.encoder.training.aspect import AspectConfig, train_aspects
    from relsearch.encoder.training.pu import PUConfig, train_pu

    corpus = data / "russell3000_companies" / "corpus.jsonl"
    operators = {}
    for short, field in (("sector", "gics_sector"), ("industry", "gics_industry")):
        config = AspectConfig(aspects=(field,), split_field="split", seed=seed, threads=threads, cache_dir=cache_dir)
        bundle, _ = train_aspects([str(corpus)], config=config)
        op = bundle.operators[f"aspect:{field}"]
        op.name, op.description = f"aspect:{short}", f"companies in the same GICS {short} (AspectCSE, query side)"
        operators[op.name] = op
    rng = random.Random(seed)
    files = {}
    for split in SPLITS:
        files[split] = folder / f"company-pairs-{split}.jsonl"
        files[split].write_text("".join(json.dumps(p) + "\n" for p in company_pairs(data, split, 4, rng)))
    config = PUConfig(positive="1", name="similar-company-pu", label_fraction=label_fraction, seed=seed,
                      threads=threads, cache_dir=cache_dir)
    bundle, _ = train_pu([str(files["train"])], dev_files=[str(files["dev"])], test_files=[str(files["test"])],
                         config=config)
    pu = bundle.operators["similar-company-pu"]
    pu.description = (f"similar business, PU-trained (PAUSE) on {label_fraction:.0%} of the labelled company pairs; "
                      "re-rank with --rerank pu-head")
    operators[pu.name] = pu
    return operators, dict(bundle.heads)


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


def write_pack(bundle, folder: Path) -> None:
    """Save the bundle and its MODEL_CARD.md aside and swap them in (world-readable: it ships inside the package)."""
    from relsearch.encoder.training.card import render_model_card
    from relsearch.encoder.training.loop import write_bundle

    write_bundle(bundle, folder, card=render_model_card(bundle, title="relsearch default relation pack", notes=[
        f"Built by `python {bundle.info['preparation']}` in {bundle.info['build_seconds']} s wall time on 2 CPU "
        "cores (including the encoding of texts not yet in the vector cache); see tools/build_pack.py for the "
        "preparation.",
        "Symmetric relations (duplicate-question, paraphrase, same-caption, contradiction, similar-company) are "
        "trained and evaluated in both directions; qa-entailment and entailment head → tail only.",
        "A best epoch of 0 means dev MRR never beat the starting point, so the operator is the identity "
        "initialisation (W = I, b = 0).",
        "Operators act on the query side only: indexes built with the encoder above stay valid.",
        "aspect:sector / aspect:industry: AspectCSE adapter operators (multi-positive contrastive loss over all training "
        "companies). similar-company-pu and the pu-head re-ranker: PAUSE (nnPU) on company pairs (same GICS industry = "
        "1, other industry = 0), keeping labels on only part of the training pairs (see the head's metrics)."]))
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
    ap.add_argument("--company-partners", type=int, default=8, help="partners per training company")
    ap.add_argument("--max-candidates", type=int, default=4096, help="sampled softmax above this many texts")
    ap.add_argument("--threads", type=int, default=1, help="torch threads while training")
    ap.add_argument("--relation", action="append", help="build only these relations (repeatable)")
    ap.add_argument("--pu-label-fraction", type=float, default=0.1,
                    help="fraction of the labelled company pairs the PU variant keeps")
    ap.add_argument("--cache-dir", default=None, help="vector cache (default ~/.cache/relsearch/vectors)")
    args = ap.parse_args(argv)

    from relsearch.encoder.training.card import summary_lines
    from relsearch.encoder.model import Encoder, EncoderConfig
    from relsearch.encoder.training import TrainConfig, train_adapter

    t0 = time.time()
    data, out = Path(args.data), Path(args.out)
    prepared = prepare(data, flickr_train_images=args.flickr_train_images,
                       company_partners=args.company_partners, seed=args.seed)
    if args.relation:
        prepared = {r: prepared[r] for r in args.relation}
    config = TrainConfig(operator=args.operator, epochs=args.epochs, lr=args.lr, seed=args.seed,
                         max_candidates=args.max_candidates, threads=args.threads, cache_dir=args.cache_dir)
    with tempfile.TemporaryDirectory(prefix="relsearch-pack-") as tmp:
        files = _write(prepared, Path(tmp))
        bundle = train_adapter(files["train"], dev_files=files["dev"], test_files=files["test"], config=config,
                               encoder=Encoder(EncoderConfig()),
                               descriptions={r: SOURCES[r]["description"] for r in prepared})
        if not args.relation or "similar-company" in args.relation:
            extra_ops, heads = company_extras(data, Path(tmp), label_fraction=args.pu_label_fraction, seed=args.seed,
                                              threads=args.threads, cache_dir=args.cache_dir)
            bundle.operators.update(extra_ops)
            bundle.heads.update(heads)
    for op in bundle.operators.values():  # temp paths mean nothing later: keep the file names only
        for split in op.info.get("data", {}).values():
            if "files" in split:
                split["files"] = [Path(f).name for f in split["files"]]
    bundle.info["sources"] = {r: {k: SOURCES[r][k] for k in ("dataset", "files", "licence")}
                              for r in bundle.operators if r in SOURCES}
    bundle.info["preparation"] = "tools/build_pack.py " + " ".join(sys.argv[1:] if argv is None else argv)
    bundle.info["build_seconds"] = round(time.time() - t0)
    write_pack(bundle, out)
    print("\n".join(summary_lines(bundle)))
    print(f"pack written to {out} in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
