"""Build the company bundle: a company-tuned encoder plus similar-company / aspect operators on top.

The default pack keeps all-MiniLM-L6-v2 unchanged (one index serves every relation), and on it
query-side operators reach only about +0.05 same-industry P@10 over plain cosine
(docs/companies.md). This bundle goes further in two steps, both plain ``relsearch train`` runs:

1. ``--objective aspect --aspect gics_industry --regime joint``: AspectCSE fine-tuning of the
   encoder on the Russell 3000 training companies (1 epoch, 64 tokens; about 13 min on 2 cores);
2. ``--objective rse`` (adapter) on that encoder: ``similar-company`` from GICS sub-industry pairs
   (the pack's recipe), and ``aspect:sector`` (AspectCSE adapter).

The encoder changes, so companies must be indexed with this bundle (``relsearch index ... --model
company-bundle``). Splits are by company (the corpus's ``split``); test companies are never seen.

    HF_HUB_OFFLINE=1 python tools/build_company_bundle.py --data ../shared/data --out company-bundle
"""
from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import build_pack  # noqa: E402  (the pack's company corpus and sources)


def company_pairs(data: Path, split: str, partners: int | None, rng: random.Random) -> list[dict]:
    """similar-company triples: mined peers (relsearch/bench/peers.py) whose head is in ``split``;
    for train both companies are, plus ``partners`` companies of the head's GICS sub-industry as a
    weak prior (group = sub-industry, so sub-industry mates are never each other's negatives).
    (The pack's similar-company is a recipe over plain cosine now; this bundle still trains an
    adapter on the fine-tuned encoder.)"""
    from collections import defaultdict

    from relsearch.bench.peers import mine_peers

    rows = build_pack._companies(data)
    by_id = {c["id"]: c for c in rows}
    triples = [{"head": by_id[a]["text"], "relation": "similar-company", "tail": by_id[b]["text"]}
               for a, b in sorted(mine_peers(rows)) if by_id[a]["split"] == split
               and (partners is None or by_id[b]["split"] == split) and by_id[a]["text"] != by_id[b]["text"]]
    if partners:
        groups = defaultdict(list)
        for c in rows:
            if c["split"] == split and c.get("gics_sub_industry_code"):
                groups[str(c["gics_sub_industry_code"])].append(c)
        for code, members in sorted(groups.items()):
            for c in members:
                others = [o for o in members if o["id"] != c["id"] and o["text"] != c["text"]]
                triples += [{"head": c["text"], "relation": "similar-company", "tail": o["text"], "group": code}
                            for o in rng.sample(others, min(partners, len(others)))]
    return triples


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="../shared/data")
    ap.add_argument("--out", default="company-bundle")
    ap.add_argument("--epochs", type=int, default=1, help="joint fine-tuning epochs")
    ap.add_argument("--max-length", type=int, default=64, help="tokens per description while fine-tuning")
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)

    from relsearch.encoder.model import Encoder, EncoderConfig
    from relsearch.encoder.training.aspect import AspectConfig, train_aspects
    from relsearch.encoder.training.card import render_model_card, summary_lines
    from relsearch.encoder.training.loop import Checkpoint, write_bundle
    from relsearch.encoder.training.rse import TrainConfig, train_adapter

    t0 = time.time()
    data, out = Path(args.data), Path(args.out)
    corpus = str(data / "russell3000_companies" / "corpus.jsonl")
    stage = out.with_name(out.name + ".stage1")
    joint = AspectConfig(aspects=("gics_industry",), split_field="split", regime="joint", epochs=args.epochs,
                         max_length=args.max_length, batch_size=32, seed=args.seed, threads=args.threads)
    tuned, encoder = train_aspects([corpus], config=joint, out=stage)
    write_bundle(tuned, stage, encoder=encoder)
    Checkpoint(stage, {}).clear()
    tuned_encoder = Encoder(EncoderConfig(model=tuned.encoder["model"], max_length=tuned.encoder["max_length"]))

    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="relsearch-companies-") as tmp:
        files = {}
        for split in build_pack.SPLITS:
            files[split] = Path(tmp) / f"similar-company-{split}.jsonl"
            rows = company_pairs(data, split, 8 if split == "train" else None, rng)
            files[split].write_text("".join(build_pack.json.dumps(r) + "\n" for r in rows))
        bundle = train_adapter([str(files["train"])], dev_files=[str(files["dev"])], test_files=[str(files["test"])],
                               config=TrainConfig(max_candidates=4096, seed=args.seed, threads=args.threads),
                               encoder=tuned_encoder,
                               descriptions={"similar-company": build_pack.SOURCES["similar-company"]["description"]})
    sector, _ = train_aspects([corpus], config=AspectConfig(aspects=("gics_sector",), split_field="split",
                                                             seed=args.seed, threads=args.threads), base=str(stage))
    op = sector.operators["aspect:gics_sector"]
    op.name = "aspect:sector"
    bundle.operators[op.name] = op
    industry = tuned.operators["aspect:gics_industry"]
    industry.name = "aspect:industry"
    bundle.operators[industry.name] = industry
    bundle.info.update(trainer="tools/build_company_bundle.py (AspectCSE joint encoder + adapter operators)",
                       build_seconds=round(time.time() - t0),
                       sources={n: {k: build_pack.SOURCES["similar-company"][k] for k in ("dataset", "files", "licence")}
                                for n in ("similar-company", "aspect:sector", "aspect:industry")})
    card = render_model_card(bundle, title="relsearch company bundle", notes=[
        f"Built by `python tools/build_company_bundle.py {' '.join(sys.argv[1:] if argv is None else argv)}` in "
        f"{bundle.info['build_seconds']} s.",
        "Identity in these tables is the fine-tuned encoder's own cosine; `relsearch bench companies --model "
        "relsearch/pack --model THIS` compares with the unchanged base encoder."])
    write_bundle(bundle, out, card=card)  # copies the fine-tuned encoder out of the stage-1 bundle
    shutil.rmtree(stage, ignore_errors=True)
    print("\n".join(summary_lines(bundle)))
    print(f"company bundle written to {out} in {time.time() - t0:.0f} s; index companies with --model {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
