"""tools/build_pack.py's answer-selection data: qa-entailment trains on TrecQA and, with ``--wikiqa``,
WikiQA's train split too, and chooses its recipe on both dev splits; its test stays TrecQA's."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[2] / "tools"


@pytest.fixture(scope="module")
def build_pack():
    sys.path.insert(0, str(TOOLS))
    try:
        import build_pack
    finally:
        sys.path.remove(str(TOOLS))
    return build_pack


def _set(folder: Path, questions: dict[str, dict[str, int]]) -> Path:
    """An answer-selection set as tools/data/{trecqa,wikiqa}.py write it, the same in every split."""
    for kind in ("pairs", "triples"):
        (folder / kind).mkdir(parents=True)
    for split in ("train", "dev", "test"):
        pairs = [{"a": q, "b": s, "label": label} for q, sents in questions.items() for s, label in sents.items()]
        (folder / "pairs" / f"{split}.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
        (folder / "triples" / f"{split}.jsonl").write_text("".join(
            json.dumps({"head": p["a"], "relation": "qa-entailment", "tail": p["b"]}) + "\n" for p in pairs if p["label"]))
    return folder


def test_wikiqa_joins_train_and_dev_with_hard_negatives_but_not_test(tmp_path, build_pack):
    data = tmp_path / "data"
    _set(data / "trecqa", {"who?": {"Ann did.": 1, "Bob did.": 1, "Rain fell.": 0}})
    wikiqa = _set(tmp_path / "wikiqa", {"what is a cat?": {"A cat is a mammal.": 1, "Cats purr.": 0}, "why?": {"No.": 0}})

    triples = build_pack.qa_triples(data / "trecqa", "train")
    assert [(t["tail"], t["negative"]) for t in triples] == [("Ann did.", "Rain fell."), ("Bob did.", "Rain fell.")]
    for split in ("train", "dev"):
        assert build_pack.qa_folders(data, wikiqa, split) == [data / "trecqa", wikiqa]
        assert build_pack._answer_candidates(data, split, wikiqa) == sorted(
            ["Ann did.", "Bob did.", "Rain fell.", "A cat is a mammal.", "Cats purr.", "No."])
    assert build_pack.qa_folders(data, wikiqa, "test") == [data / "trecqa"]  # the pack's own test: TrecQA's
    assert build_pack._answer_candidates(data, "test", wikiqa) == ["Ann did.", "Bob did.", "Rain fell."]
    assert build_pack.qa_folders(data, None, "train") == [data / "trecqa"]
    assert build_pack.qa_triples(wikiqa, "dev") == [{"head": "what is a cat?", "relation": "qa-entailment",
                                                      "tail": "A cat is a mammal.", "negative": "Cats purr."}]


def test_a_wikiqa_folder_without_pairs_is_refused_in_one_line(tmp_path, build_pack, capsys):
    with pytest.raises(SystemExit):
        build_pack.main(["--data", str(tmp_path), "--wikiqa", str(tmp_path / "nowhere"), "--relation", "qa-entailment"])
    assert f"--wikiqa {tmp_path / 'nowhere'}: no pairs/train.jsonl there" in capsys.readouterr().err
