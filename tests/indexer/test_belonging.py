"""Texts that belong (indexer/belonging.py): a text about another record of the corpus is flagged
with a reason and kept out of its record's vectors by ``relsearch index``; share classes keep
their shared texts, and a competitor named in a later sentence flags nothing."""
import json

import numpy as np
from click.testing import CliRunner

from relsearch.indexer import belonging
from relsearch.indexer import records as rec
from relsearch.indexer import reader
from relsearch.indexer.field_view import all_norms, field_view
from relsearch.pipelines.index import IndexJob, run_index
from relsearch.retrieval.search import Query, Searcher
from conftest import write_jsonl

ALPHABET = ("Alphabet Inc. is an American multinational conglomerate headquartered in Mountain View, California. "
            "It was created through a restructuring of Google on October 2, 2015, and became the parent company of "
            "Google and several former Google subsidiaries.")
CHASE_BANK = ("JPMorgan Chase Bank, N.A., doing business as Chase Bank or often as Chase, is a national bank "
              "headquartered in Manhattan, New York City, that constitutes the consumer and commercial banking "
              "subsidiary of the U.S. multinational banking and financial services holding company.")
BERKSHIRE = ("Berkshire Bank is a bank headquartered in Boston, Massachusetts. It is a subsidiary of Berkshire Hills "
             "Bancorp and operates 130 branches across New England and New York, offering deposits, loans, wealth "
             "management and insurance to individuals and businesses.")
REIT = ("A real estate investment trust (REIT) is a company that owns, and in most cases operates, income-producing "
        "real estate such as offices, apartments and warehouses.")
FIELDS = ("text", "text_wikipedia")
ROWS = [
    {"id": "GOOG", "name": "Alphabet Inc.", "text": "Alphabet Inc. provides online advertising services.",
     "text_wikipedia": ALPHABET},
    {"id": "GOOGL", "name": "Alphabet Inc.", "text": "Alphabet Inc. provides online advertising services.",
     "text_wikipedia": ALPHABET},  # a share class: one issuer, its texts its own
    {"id": "AAT", "name": "American Assets Trust, Inc.", "text": "American Assets Trust owns office and retail "
     "properties in California and Hawaii.", "text_wikipedia": ALPHABET},
    {"id": "DNOW", "name": "NOW Inc.", "text": "NOW Inc. distributes pipe, valves and fittings to the energy "
     "industry.", "text_wikipedia": ALPHABET},
    {"id": "JPM", "name": "JPMorgan Chase & Co.", "text": "JPMorgan Chase & Co. operates as a financial services "
     "company worldwide.", "text_wikipedia": "JPMorgan Chase & Co. is an American multinational investment bank "
     "headquartered in New York City."},
    {"id": "CCF", "name": "Chase Corporation", "text": "Chase Corporation, a specialty chemicals company, makes "
     "protective materials and tapes.", "text_wikipedia": CHASE_BANK},
    {"id": "WFC", "name": "Wells Fargo & Company", "text": "Wells Fargo & Company is a diversified bank. It "
     "competes with JPMorgan Chase & Co. and Bank of America in consumer lending.",
     "text_wikipedia": "Wells Fargo & Company is an American multinational financial services company. Its rivals "
     "include JPMorgan Chase, and Alphabet Inc. runs a payments business too."},
    {"id": "BHLB", "name": "Berkshire Hills Bancorp, Inc.", "text_wikipedia": BERKSHIRE},
    {"id": "FCBP", "name": "First Choice Bancorp", "text": "First Choice Bancorp is the holding company of First "
     "Choice Bank in California.", "text_wikipedia": BERKSHIRE.replace("130 branches", "about 130 branches")},
    {"id": "APLE", "name": "Apple Hospitality REIT, Inc.", "text_wikipedia": "Apple Hospitality is a real estate "
     "investment trust that owns upscale hotels."},
    {"id": "AAPL", "name": "Apple Inc.", "text": "Apple Inc. designs the iPhone and the Mac."},
    {"id": "HUD", "name": "Hudson Ltd.", "text": "Hudson Ltd. runs airport stores."},
    {"id": "RESI", "name": "Front Yard Residential Corporation", "text": "Front Yard Residential owns single-family "
     "rental homes.", "text_wikipedia": "Hudson Yards is a neighborhood on the West Side of Midtown Manhattan."},
    {"id": "CIO", "name": "City Office REIT, Inc.", "text_wikipedia": REIT},
    {"id": "MITT", "name": "AG Mortgage Investment Trust, Inc.", "text": "AG Mortgage Investment Trust invests in "
     "residential mortgage assets.", "text_wikipedia": REIT},
    {"id": "ETN", "name": "Eaton Corporation", "text_wikipedia": "No Description Available"},
    {"id": "PNR", "name": "Pentair Ltd.", "text_wikipedia": "No Description Available"},
]


def _rows(rows=ROWS, fields=FIELDS):
    return [(r["id"], r.get("name"), {f: r[f] for f in fields if r.get(f)}) for r in rows]


def test_a_text_about_another_record_is_flagged_with_its_reason():
    flags = {(f.id, f.field): f.reason() for f in belonging.misattributed(_rows())}
    assert flags == {
        ("AAT", "text_wikipedia"): "text_wikipedia: about Alphabet Inc. (GOOG): its subject",
        ("DNOW", "text_wikipedia"): "text_wikipedia: about Alphabet Inc. (GOOG): its subject",
        ("CCF", "text_wikipedia"): "text_wikipedia: about JPMorgan Chase & Co. (JPM): its subject",
        ("FCBP", "text_wikipedia"): "text_wikipedia: about Berkshire Hills Bancorp, Inc. (BHLB): near-identical to "
                                    "its text_wikipedia (Jaccard 0.82)",
        ("CIO", "text_wikipedia"): "text_wikipedia: held verbatim by 1 other (MITT), naming none of them",
        ("MITT", "text_wikipedia"): "text_wikipedia: held verbatim by 1 other (CIO), naming none of them",
        # one word of "Hudson Ltd." is not the subject "Hudson Yards", but the page names Front Yard nowhere
        ("RESI", "text_wikipedia"): "text_wikipedia: names its record nowhere, as its other texts do",
    }
    # not flagged: GOOG and GOOGL (one name, share classes), WFC (rivals named after its subject), BHLB's own
    # text, APLE ("Apple Hospitality" is its own name, not Apple Inc.), the short placeholder ETN and PNR share


def test_a_text_naming_its_record_nowhere_is_flagged_unless_the_others_name_its_subject():
    bottling = "This is a list of bottling companies. A bottler is a company that bottles beverages."
    rows = [("GOOD", "Gladstone Commercial Corporation", {"y": "Gladstone Commercial is a REIT owning offices.",
                                                          "w": bottling}),
            # its ticker is a word ("home") of the page about another firm: no excuse
            ("HOME", "At Home Group Inc.", {"y": "At Home Group Inc. operates home decor superstores.",
                                            "w": "Home Box Office, Inc. is a pay television network; home of drama."}),
            # a former name that its other text gives: its own page
            ("SGEN", "Seagen Inc.", {"y": "Seagen Inc., formerly Seattle Genetics, develops antibodies.",
                                     "w": "Seattle Genetics, Inc. is a biotechnology company in Bothell."}),
            # initials, its id, a glued name, accents spelt two ways: all name it
            ("OFC", "Corporate Office Properties Trust", {"y": "COPT is a REIT that owns office parks.",
                                                          "w": "Corporate Office Properties Trust is a REIT."}),
            ("DHC", "Diversified Healthcare Trust", {"y": "DHC is a REIT of medical offices.",
                                                     "w": "Diversified Healthcare Trust owns clinics."}),
            ("NBEV", "NewAge, Inc.", {"y": "New Age Beverages Corporation sells drinks.", "w": "NewAge, Inc. sells tea."}),
            ("EL", "The Estée Lauder Companies Inc.", {"y": "The EstÃ©e Lauder Companies Inc. makes skin care.",
                                                      "w": "The Estee Lauder Companies Inc. sells makeup."}),
            # one text only: nothing to compare it with
            ("SOLO", "Solo Brands, Inc.", {"y": "A maker of fire pits and coolers."})]
    flags = {(f.id, f.field): f.reason() for f in belonging.misattributed(rows)}
    assert flags == {("GOOD", "w"): "w: names its record nowhere, as its other texts do",
                     ("HOME", "w"): "w: names its record nowhere, as its other texts do"}


def test_share_classes_of_one_issuer_keep_a_shared_text_whatever_their_class_suffix():
    rows = [("GOOGL", "Alphabet Inc Class A", {"text": "Google Inc. (Google) is a global technology company that "
                                                        "runs search, advertising, maps and cloud services."}),
            ("GOOG", "Alphabet Inc Class C", {"text": "Google Inc. (Google) is a global technology company that "
                                                       "runs search, advertising, maps and cloud services."}),
            ("DISCA", "Discovery Communications-A", {"text": "Discovery Communications, Inc. (Discovery) is a "
                                                             "global nonfiction media and entertainment company."}),
            ("DISCK", "Discovery Communications-C", {"text": "Discovery Communications, Inc. (Discovery) is a "
                                                             "global nonfiction media and entertainment company."})]
    assert belonging.misattributed(rows) == []


def test_names_are_matched_as_whole_words_at_their_longest():
    assert belonging.short_name("The Coca-Cola Company") == "Coca-Cola"
    assert belonging.tokens("V.F. Corporation") == belonging.tokens("VF Corporation") == ("vf", "corporation")
    # the "VF Corporation" intro held by V.F. and by Delta Apparel: V.F. keeps it, Delta Apparel loses it
    vf = ("VF Corporation is an American worldwide apparel and footwear company founded in 1899 and headquartered in "
          "Denver, Colorado.")
    flags = belonging.misattributed([("VFC", "V.F. Corporation", {"w": vf}), ("DLA", "Delta Apparel, Inc.", {"w": vf})])
    assert [(f.id, f.about_id, f.why) for f in flags] == [("DLA", "VFC", "its subject")]


def test_a_corpus_without_names_gets_no_flags(tmp_path):
    rows = [{k: v for k, v in r.items() if k != "name"} for r in ROWS]
    corpus = write_jsonl(tmp_path / "c.jsonl", rows)
    assert belonging.check_corpus(str(corpus), text_fields=FIELDS) == {}
    named = write_jsonl(tmp_path / "n.jsonl", [{**r, "issuer": name["name"]} for r, name in zip(rows, ROWS)])
    by_line = belonging.check_corpus(str(named), text_fields=FIELDS, name_field="issuer")  # --collapse-field issuer
    assert sorted((n, f.id) for n, fs in by_line.items() for f in fs) == [
        (3, "AAT"), (4, "DNOW"), (6, "CCF"), (9, "FCBP"), (13, "RESI"), (14, "CIO"), (15, "MITT")]


def test_a_record_keeps_its_other_texts_and_one_left_with_none_is_rejected_with_the_reason():
    flags = belonging.misattributed(_rows())
    ccf = next(f for f in flags if f.id == "CCF")
    r = belonging.parse_line(6, json.dumps(ROWS[5]).encode(), [ccf], text_fields=FIELDS)
    assert isinstance(r, rec.Record) and list(r.texts) == ["text"] and r.metadata["text_wikipedia"] is None
    cio = next(f for f in flags if f.id == "CIO")
    gone = belonging.parse_line(14, json.dumps(ROWS[13]).encode(), [cio], text_fields=FIELDS)
    assert (gone.reason, gone.detail) == (belonging.MISATTRIBUTED, cio.reason())
    one = belonging.parse_line(14, json.dumps(ROWS[13]).encode(), [cio], text_field="text_wikipedia")
    assert one.reason == belonging.MISATTRIBUTED  # one text field: the same


def test_index_leaves_the_flagged_text_out_of_the_documents_vectors_and_reports_it(tmp_path):
    from relsearch.cli import cli

    corpus = write_jsonl(tmp_path / "corpus.jsonl", ROWS)
    target = tmp_path / "idx"
    out = CliRunner().invoke(cli, ["index", str(corpus), "--index", str(target), "--text-field", "text",
                                    "--text-field", "text_wikipedia", "--collapse-field", "name", "--quiet"])
    assert out.exit_code == 0, out.output
    # CIO's only text was the shared REIT definition: rejected, and read = indexed + rejected still
    assert "read 17, indexed 16, rejected 1 (misattributed-text: 1)" in out.output
    assert ("misattributed: 7 texts not about their record left out of its vectors (--keep-misattributed "
            "keeps them; all in the manifest's runs): AAT text_wikipedia: about Alphabet Inc. (GOOG): its subject;"
            in out.output)
    files = reader.open_index(target)
    try:
        run = files.manifest.runs[-1]
        assert "CCF text_wikipedia: about JPMorgan Chase & Co. (JPM): its subject" in run["misattributed"]
        positions = files.docstore.positions(["CCF", "GOOG", "GOOGL", "AAT", "JPM"])
        norms = all_norms(files)
        assert tuple(norms[positions["CCF"]] > 0) == (True, False)  # its own text only
        assert tuple(norms[positions["GOOGL"]] > 0) == (True, True)
        wiki = field_view(files, "text_wikipedia")
        held = {int(p) for s in wiki.segments for p in s.bm25.positions}
        assert positions["CCF"] not in held and positions["AAT"] not in held and positions["JPM"] in held
        assert json.loads((target / "rejected.jsonl").read_text().splitlines()[0])["reason"] == "misattributed-text"
    finally:
        files.docstore.close()
        files.close_faiss_fd()
    hits = Searcher(str(target)).for_field("text_wikipedia").search(
        [Query(text="national bank headquartered in Manhattan doing business as Chase Bank")], k=20)[0]
    assert "CCF" not in [h.id for h in hits] and "AAT" not in [h.id for h in hits]


def test_keep_misattributed_indexes_every_text(tmp_path):
    corpus = write_jsonl(tmp_path / "corpus.jsonl", ROWS[4:6])  # JPM and Chase Corporation
    target = tmp_path / "idx"
    report = run_index(IndexJob(input=str(corpus), index=str(target), text_fields=FIELDS, progress=False,
                                keep_misattributed=True))
    assert (report.indexed, report.misattributed) == (2, [])
    flagged = run_index(IndexJob(input=str(corpus), index=str(tmp_path / "checked"), text_fields=FIELDS,
                                 progress=False))
    assert flagged.misattributed == ["CCF text_wikipedia: about JPMorgan Chase & Co. (JPM): its subject"]
    for where, wiki in ((target, True), (tmp_path / "checked", False)):
        files = reader.open_index(where)
        try:
            assert bool(all_norms(files)[files.docstore.positions(["CCF"])["CCF"], 1] > 0) is wiki
            assert np.all(all_norms(files)[files.docstore.positions(["JPM"])["JPM"]] > 0)
        finally:
            files.docstore.close()
            files.close_faiss_fd()
