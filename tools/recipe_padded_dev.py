"""Would a relation's recipe change if its dev corpus were the size of an index? (issue 41, part 3)

tools/build_pack.py chooses each recipe on dev by whole-corpus retrieval over the dev split's own
texts (149 sentences for SICK's contradiction, 1,038 for TrecQA's qa-entailment), far fewer than an
index holds; BM25's and identity's worth move with the corpus. This chooses the shipped relation's
recipe again (retrieval/recipe_fit.py ``fit``, the pack's operator) twice — on dev as built, and on
the same dev queries over dev plus every sentence of the train split as distractors — and prints both
recipes with their dev and test figures. Nothing of a transfer set is read; the pack is not written.

    HF_HUB_OFFLINE=1 python tools/recipe_padded_dev.py contradiction   # or qa-entailment
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import build_pack  # noqa: E402  (the pack's own preparation of each relation's splits)

PAIRS = {"contradiction": "sick", "qa-entailment": "trecqa"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("relation", choices=sorted(PAIRS))
    ap.add_argument("--data", default="../shared/data")
    ap.add_argument("--model", default="relsearch/pack")
    args = ap.parse_args(argv)

    from relsearch.encoder.bundle import load_bundle
    from relsearch.encoder.model import Encoder, EncoderConfig
    from relsearch.encoder.training import encode_cached
    from relsearch.retrieval.recipe_fit import Corpus, fit

    data, name = Path(args.data), args.relation
    prepared = build_pack.prepare(data, flickr_train_images=None, seed=13)[name]
    pack = load_bundle(args.model)
    encoder = Encoder(EncoderConfig())
    qa = name == "qa-entailment"

    def encode(texts):
        return encode_cached(encoder, texts, cache_dir=None, progress=False)

    def own(split):  # what build_pack.fit_recipes searches: tails, hard negatives, for qa every sentence
        texts = [x for t in prepared[split] for x in (t["tail"], t.get("negative")) if x]
        return texts + (build_pack._answer_candidates(data, split) if qa else [])

    def every_sentence(split):
        pairs = build_pack._read(data / PAIRS[name] / "pairs" / f"{split}.jsonl")
        return [p["b"] for p in pairs] if qa else [x for p in pairs for x in (p["a"], p["b"])]

    def pairs(split):
        return [(t["head"], t["tail"]) for t in prepared[split]]

    test = Corpus.of_pairs(pairs("test"), own("test"), heads=not qa)
    for label, texts in (("dev as built", own("dev")), ("dev + every train sentence", own("dev") + every_sentence("train"))):
        dev = Corpus.of_pairs(pairs("dev"), texts, heads=not qa)
        report = fit(copy.deepcopy(pack.operators[name]), dev, test, encode)
        shown = {split: {k: round(v, 3) for k, v in report[split].items() if isinstance(v, float)} for split in ("dev", "test")}
        print(f"{label} ({dev.candidates} texts): recipe {json.dumps(report['recipe'])}; dev {shown['dev']}; "
              f"test {shown['test']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
