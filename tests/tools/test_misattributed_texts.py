"""tools/data/misattributed_texts.py: a text several companies of different names hold stays only
with those it names; share classes keep theirs."""
import importlib.util
import json

from conftest import REPO, write_jsonl

spec = importlib.util.spec_from_file_location("misattributed_texts", REPO / "tools" / "data" / "misattributed_texts.py")
tool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tool)

ALPHABET = "Alphabet Inc. is an American multinational conglomerate headquartered in Mountain View."


def test_a_shared_text_stays_with_the_companies_it_names(tmp_path, capsys):
    rows = [{"id": "GOOG", "name": "Alphabet Inc.", "text_wikipedia": ALPHABET},
            {"id": "GOOGL", "name": "Alphabet Inc.", "text_wikipedia": ALPHABET},
            {"id": "AAT", "name": "American Assets Trust, Inc.", "text_wikipedia": ALPHABET, "text": "REIT."},
            {"id": "FOX", "name": "Fox Corporation", "text_wikipedia": "Fox Corporation is a media company."},
            {"id": "FOXA", "name": "Fox Corporation", "text_wikipedia": "Fox Corporation is a media company."},
            {"id": "X", "name": "Lonely Co", "text_wikipedia": None}]
    fixes, shared = tool.misattributed(rows, "text_wikipedia")
    assert shared == 1 and fixes == [{**rows[2], "text_wikipedia": None}]
    corpus = write_jsonl(tmp_path / "c.jsonl", rows)
    assert tool.main([str(corpus)]) == 0
    out, err = capsys.readouterr()
    assert [json.loads(line)["id"] for line in out.splitlines()] == ["AAT"]
    assert "1 text_wikipedia texts are held by companies of different names; 1 records" in err
