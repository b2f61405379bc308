"""Every rejection reason, one line each (no model needed)."""
import pytest

from relsearch.indexer import records as rec


@pytest.mark.parametrize("raw, reason", [
    (b"\xff\xfe not utf-8", rec.UNDECODABLE),
    (b'{"id": "a", "text": ', rec.INVALID_JSON),
    (b'["a", "b"]', rec.NOT_OBJECT),
    (b'{"text": "no id"}', rec.MISSING_ID),
    (b'{"id": null, "text": "null id"}', rec.MISSING_ID),
    (b'{"id": "  ", "text": "blank id"}', rec.EMPTY_ID),
    (b'{"id": {"x": 1}, "text": "object id"}', rec.NON_STRING_ID),
    (b'{"id": 1.5, "text": "float id"}', rec.NON_STRING_ID),
    (b'{"id": true, "text": "bool id"}', rec.NON_STRING_ID),
    (b'{"id": ["a"], "text": "list id"}', rec.NON_STRING_ID),
    (b'{"id": "a"}', rec.MISSING_TEXT),
    (b'{"id": "a", "text": null}', rec.NULL_TEXT),  # not "no 'text' field": the field is there (issue 28)
    (b'{"id": "a", "text": "   "}', rec.EMPTY_TEXT),
    (b'{"id": "a", "text": 42}', rec.NON_STRING_TEXT),
    (b"   ", rec.EMPTY_LINE),
])
def test_each_rejection_reason(raw, reason):
    result = rec.parse_line(7, raw)
    assert isinstance(result, rec.Rejection)
    assert (result.line, result.reason) == (7, reason)


def test_valid_line_keeps_other_fields_as_metadata():
    r = rec.parse_line(1, '{"id": 5, "text": "Zürich bank", "country": "CH"}'.encode())
    assert r == rec.Record(1, "5", "Zürich bank", {"country": "CH"})


def test_custom_field_names():
    r = rec.parse_line(1, b'{"ticker": "A", "desc": "x", "id": "meta"}', id_field="ticker", text_field="desc")
    assert (r.id, r.text, r.metadata) == ("A", "x", {"id": "meta"})


def test_null_text_says_the_field_is_null_and_a_lookup_reads_it_as_an_id():
    """Issue 28: ``"text": null`` was rejected as "no 'text' field" although the field is there."""
    from relsearch.pipelines.lookup import LookupInput, parse_lookup_line

    r = rec.parse_line(3, b'{"id": "a", "text": null}')
    assert (r.reason, r.detail) == (rec.NULL_TEXT, "'text' is null")
    assert rec.parse_line(3, b'{"id": "a"}').detail == "no 'text' field"
    assert parse_lookup_line(3, b'{"id": "a", "text": null}') == LookupInput(3, "a")
