"""The --filter text grammar (indexer/filter_grammar.py): its tokens, precedence, escapes and depth limit,
and one-line refusals that name the position. The forms that keep their old meaning are in
tests/indexer/test_filters.py (test_filter_grammar and after); the CLI and HTTP in
tests/cli_api/test_validation_table.py."""
from __future__ import annotations

import pytest

from relsearch.indexer import filter_grammar as fg
from relsearch.indexer import filters as flt

F4 = 'name in ["\\\\", ' + "[" * 3000 + "]" * 3000 + "]"  # name in ["\\", [[[…]]]]
F7 = 'name = "\\\\" or name = "3M Company"'  # name = "\\" or name = "3M Company"

# (text, position, piece of the message): issue 50's cases first
REFUSED = [
    (F4, 47, "brackets nest more than 32 deep"),  # the 33rd bracket, counting the list's own
    ("gics_sector==", 12, "'==' is not an operator; write gics_sector=VALUE"),
    ("founded>=", 10, "expected a value after '>='"),
    ("gics_sector=Financials AND", 27, "expected a field after 'AND'"),
    ("gics_sector=Financials and", 27, "expected a field after 'and'"),
    ("a=1 or", 7, "expected a field after 'or'"),
    ("a=1 b=2", 5, "expected 'and' or 'or' before 'b='"),
    ('x="a" b', 7, "expected 'and', 'or' or the end, got 'b'"),
    ('x=say "hi"', 7, "a double quote inside an unquoted value"),
    ('x="abc', 7, "the string opened at position 3 is never closed"),
    ('x="a\\qb"', 5, "bad escape in the string opened at position 3"),
    ("x in [1", 8, "expected ',' or ']' to close the list opened at position 6"),
    ("x in []", 7, "expected a value in the list"),
    ("x in [a,,b]", 9, "expected a value in the list"),
    ('x in ["a" b]', 11, "expected ',' or ']'"),
    ("x in Energy", 6, "'in' takes a list in brackets"),
    ("x is nul", 6, "expected 'null' after 'x is', got 'nul'"),
    ("my field=1", 4, "after the field 'my', got 'field' (a field name with spaces goes in double quotes)"),
    ("not not a=1", 5, "expected a field after 'not', got 'not'"),
    ("=US", 1, "expected a field, got '='"),
    ("x!1", 2, "'!' is not an operator"),
    ("", 1, "expected a field"),
]


@pytest.mark.parametrize(("text", "position", "message"), REFUSED, ids=[t[:30] for t, _, _ in REFUSED])
def test_malformed_text_is_refused_in_one_line_naming_the_position(text, position, message):
    with pytest.raises(fg.FilterSyntaxError) as e:
        fg.parse_filter(text)
    said = str(e.value)
    assert "\n" not in said and message in said, said
    assert e.value.position == position and f"at position {position}" in said, said
    assert isinstance(e.value, ValueError) and isinstance(e.value, flt.FilterError)  # every caller's except holds


def test_an_escaped_backslash_closes_its_string():
    """F-7: ``"\\\\"`` is one backslash and its quote ends the string; the old splitter saw an escaped
    quote and read the rest, `or` included, as one value (and F-4's brackets as quoted text)."""
    assert fg.parse_filter(F7) == ("$any", "any", [{"name": "\\"}, {"name": "3M Company"}], False)
    assert fg.parse_filter('x in ["\\\\", "]", "a\\"b"]') == ("x", "in", ["\\", "]", 'a"b'], False)
    assert fg.parse_filter('title="War or Peace"') == ("title", "eq", "War or Peace", False)
    assert fg.parse_filter('x="\\u00e9\\n"') == ("x", "eq", "é\n", False)  # JSON escapes
    assert fg.parse_filter('"my field"=1') == ("my field", "eq", 1, False)  # a quoted field


def test_and_binds_tighter_than_or_and_keywords_take_any_case():
    assert fg.read_filters("a=1 and b>=2 or c=3") == {"$any": [{"a": 1, "b": {"gte": 2}}, {"c": 3}]}
    assert fg.read_filters("a=1 OR not b exists And c in [x]") == {
        "$any": [{"a": 1}, {"b": {"not": {"exists": True}}, "c": {"in": ["x"]}}]}
    # `and` at the top is the same as repeated --filter options, refusals included
    assert fg.read_filters("year>=2010 and year<2020 and sector=Energy") == fg.read_filters(
        ["year>=2010", "year<2020", "sector=Energy"]) == {"year": {"gte": 2010, "lt": 2020}, "sector": "Energy"}
    with pytest.raises(ValueError, match="eq given twice"):
        fg.read_filters("c=US and c=CA")
    assert fg.read_filters("a=1 or b=2 and c=3") == {"$any": [{"a": 1}, {"b": 2, "c": 3}]}


def test_bare_values_keep_their_documented_meaning():
    assert fg.parse_filter("gics_sector=Information Technology") == (
        "gics_sector", "eq", "Information Technology", False)
    assert fg.parse_filter("hq=Houston, Texas") == ("hq", "eq", "Houston, Texas", False)
    assert fg.parse_filter("title=War not Peace") == ("title", "eq", "War not Peace", False)  # not: only in front
    assert fg.parse_filter("title=Orlando or x=1")[0] == "$any"
    assert fg.parse_filter("title=Sandor") == ("title", "eq", "Sandor", False)  # `or` only as a word
    assert fg.parse_filter("url = a=b") == ("url", "eq", "a=b", False)
    assert fg.parse_filter("not=1") == ("not", "eq", 1, False)  # a keyword before an operator is a field
    assert fg.parse_filter("x=1e999") == ("x", "eq", "1e999", False)  # not a finite number: text


def test_the_lexer_marks_strings_operators_brackets_and_words():
    toks = fg.tokens('a>= "b\\"c" [1,{x}]')
    assert [t.kind for t in toks] == ["word", "op", "string", "[", "word", ",", "{", "word", "}", "]", "end"]
    assert toks[2].value == 'b"c' and (toks[2].start, toks[2].end) == (4, 10) and toks[2].space
    assert not toks[1].space and toks[-1].start == 18


def test_the_depth_limit_is_explicit_and_strings_do_not_count():
    ok = "[" * fg.MAX_FILTER_NESTING + "]" * fg.MAX_FILTER_NESTING
    assert fg.parse_filter(f"x={ok}") == ("x", "eq", ok, False)
    with pytest.raises(fg.FilterSyntaxError, match="brackets nest more than 32 deep"):
        fg.parse_filter(f"x=[{ok}]")
    assert fg.parse_filter('x="' + "[" * 5000 + '"')[2] == "[" * 5000


def test_the_number_of_predicates_is_bounded():
    fg.parse_filter(" or ".join(["a=1"] * flt.MAX_CLAUSES))
    with pytest.raises(fg.FilterSyntaxError, match="at most 1,024 are allowed"):
        fg.parse_filter(" or ".join(["a=1"] * (flt.MAX_CLAUSES + 1)))


def test_read_filters_names_a_wrong_type():
    with pytest.raises(flt.FilterError, match="a string or a list of strings"):
        fg.read_filters(["a=1", 2])
