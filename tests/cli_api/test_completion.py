"""Completion by the names people use (relsearch/completion.py): names compared without articles,
legal forms or the spaces between words, aliases and prominence mined from the corpus's own texts.
Ranking by id, name and word inside a name on crafted names: test_explorer.py."""
from __future__ import annotations

import functools
import json

import numpy as np
import pytest
from conftest import shared

from relsearch import completion
from relsearch.indexer import mining
from relsearch.indexer.docstore import DocStore
from relsearch.indexer.segments import Documents

RUSSELL_TEXTS = ("text", "text_wikipedia", "text_bloomberg")
# the companies the issue named, and the share class and bottler that compete with them for a prefix
NAMED = {"JPM", "GOOG", "GOOGL", "UNH", "XOM", "KO", "COKE"}


def _docs(tmp_path, records: list[dict], text_fields: tuple[str, ...]) -> Documents:
    """A one-segment docstore as a three-text index stores it: the first text present in ``text``,
    the others (and the name) in the metadata."""
    path = str(tmp_path / "docs.sqlite")
    store = DocStore(path, create=True)
    store.add([(pos, r["id"], next(r[f] for f in text_fields if r.get(f)),
                {k: v for k, v in r.items() if k not in ("id", text_fields[0]) and v is not None}, 1.0)
               for pos, r in enumerate(records)])
    store.close()
    return Documents([DocStore(path)], np.zeros(0, np.int64), len(records))


@pytest.fixture(scope="module")
def russell(tmp_path_factory) -> Documents:
    """The real Russell 3000 rows of NAMED and every tenth other company with a text (~300)."""
    lines = shared("russell3000_companies", "corpus.jsonl").read_text().splitlines()
    rows = [r for i, r in enumerate(map(json.loads, lines))
            if (i % 10 == 0 or r["id"] in NAMED) and any(r.get(f) for f in RUSSELL_TEXTS)]
    assert NAMED <= {r["id"] for r in rows}
    return _docs(tmp_path_factory.mktemp("russell"), rows, RUSSELL_TEXTS)


def _complete(docs, prefix: str, limit: int, texts) -> list[dict]:
    """completion.complete of ``docs`` with what an index of them mines (indexer/mining.py write)."""
    return completion.complete(docs, "name", _mined(docs, texts), prefix, limit)


@functools.cache
def _mined(docs, texts) -> mining.Mined:
    return mining.mine_documents(docs, "name", texts)


def _ids(docs, prefix: str, limit: int = 10, texts=RUSSELL_TEXTS) -> list[str]:
    return [m["id"] for m in _complete(docs, prefix, limit, texts)]


@pytest.mark.parametrize("prefix, wanted", [("jp morgan", {"JPM"}), ("google", {"GOOG", "GOOGL"}),
                                            ("united health", {"UNH"}), ("exxon", {"XOM"}),
                                            ("coca cola", {"KO"}), ("JPMorgan", {"JPM"}), ("Exxon-Mobil", {"XOM"})])
def test_the_names_people_use_find_the_company_first(russell, prefix, wanted):
    assert set(_ids(russell, prefix, 3)) & wanted, _ids(russell, prefix, 3)


def test_the_major_firm_comes_before_the_lesser_one_of_the_same_name(russell):
    found = _ids(russell, "coca")
    assert found.index("KO") < found.index("COKE")  # other texts name The Coca-Cola Company
    assert _ids(russell, "google", 2) == ["GOOG", "GOOGL"]  # the alias its own texts use most
    answer = _complete(russell, "google", 1, RUSSELL_TEXTS)
    assert answer == [{"id": "GOOG", "name": "Alphabet Inc."}]  # the answer's shape is unchanged


def test_an_alias_comes_after_every_name_match(tmp_path):
    records = [{"id": "ALPH", "name": "Alphabet Inc.", "text": "Alphabet Inc. is the parent of Google. Google "
                "Search and Google Maps are Google products."},
               {"id": "GOOX", "name": "Googly Eyes Corp", "text": "Googly Eyes Corp makes toys."},
               {"id": "TMK", "name": "Toy Maker Ltd", "text": "Toy Maker Ltd sells toys to Google once."}]
    docs = _docs(tmp_path, records, ("text",))
    assert _ids(docs, "goog", texts=("text",)) == ["GOOX", "ALPH"]  # a name first, then an alias
    assert _ids(docs, "google", texts=("text",)) == ["ALPH"]  # used 4 times (TMK's once: no alias)
    assert _ids(docs, "toys", texts=("text",)) == []  # lowercase words are no names
    # a prefix as long as a key is checked whole, alias included
    assert _ids(docs, "alphabet is the parent of google", texts=("text",)) == []


def test_name_words_drop_articles_and_legal_forms():
    assert completion.name_words("The Coca-Cola Company") == ["coca", "cola"]
    assert completion.name_words("JPMorgan Chase & Co.") == ["jpmorgan", "chase"]
    assert completion.name_words("UnitedHealth Group Incorporated") == ["unitedhealth"]
    assert completion.name_words("The Company") == ["company"]  # one word is always kept
    starts, inner = completion.name_keys("JPMorgan Chase & Co.")
    assert "jpmorganchase" in starts and "chase co " in inner and not any(k.startswith("co ") for k in inner)


def test_capitalised_runs_are_the_names_in_a_text():
    runs = completion.capitalised_runs("Alphabet Inc. is the parent of Google. The Coca-Cola Company, a maker, "
                                       "works with J.P. Morgan and Bank of America's branches.")
    assert {"alphabet", "google", "coca", "coca cola", "j p morgan", "bank of america"} <= set(runs)
    assert not {"google the", "is", "the", "bank of", "coca cola company"} & set(runs)


def test_mined_aliases_need_uses_and_rarity():
    texts = {0: ["Alphabet owns Google. Google Search, Google Maps."],
             1: ["Acme sells to Google, Google and Google. Acme runs California offices."]}
    texts.update({i: [f"Firm{i} of California and Google."] for i in range(2, 12)})  # Google: in 12 of 12 texts
    names = {0: "Alphabet Inc.", 1: "Acme Corp"} | {i: f"Firm{i} Inc." for i in range(2, 12)}
    mined = completion.mine(texts, names)
    assert 0 not in mined.aliases and 1 not in mined.aliases  # "google": too common here to name one company
    mined = completion.mine({0: texts[0], 1: texts[1]}, names)
    assert mined.aliases[0] == [("google", 3)] and mined.aliases[1] == [("google", 3)]
    # prominence: other texts naming it (Acme's name "acme" in none but its own), then its text
    mined = completion.mine({0: ["Alphabet."], 1: ["Acme buys from Alphabet."], 2: ["Alphabet, Acme."]}, names)
    assert mined.prominence[0] > mined.prominence[1]
