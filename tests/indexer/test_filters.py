"""Typed metadata filters: the semantics table, the --filter grammar, the indexed plan, migration,
the Elasticsearch translation, and a filtered search that returns k whenever k match."""
from __future__ import annotations

import sqlite3
import time

import numpy as np
import pytest

from relsearch.indexer import filters as flt
from relsearch.indexer.docstore import DocStore
from relsearch.retrieval.elastic import filter_clauses
from relsearch.retrieval.inputs import merge_filters, parse_filter

DOCS = {
    "bool_true": {"v": True},
    "int_one": {"v": 1},
    "float_one": {"v": 1.0},
    "str_one": {"v": "1"},
    "big": {"v": 2**70},
    "year_2009": {"v": 2009, "tags": ["energy", "finance"]},
    "year_2015": {"v": 2015.5, "tags": ["Finance"]},
    "text_apple": {"v": "Apple", "tags": []},
    "text_strasse": {"v": "Straße"},
    "null": {"v": None},
    "list_v": {"v": [1, "x", True]},
    "object_v": {"v": {"a": 1}},
    "no_v": {"other": 1},
    "huge": {"v": 10**400, "other": 2},  # valid JSON, beyond float: kept, never compared as a number
    'quote"key': {'we"ird': "ok"},
}

# filter on field "v" (or as given) → the documents it matches
TABLE = [
    ({"v": True}, {"bool_true", "list_v"}),
    ({"v": 1}, {"int_one", "float_one", "list_v"}),  # 1 == 1.0; never true, never "1"
    ({"v": 1.0}, {"int_one", "float_one", "list_v"}),
    ({"v": "1"}, {"str_one"}),
    ({"v": 2**70}, {"big"}),
    ({"v": {"gte": 2009}}, {"big", "year_2009", "year_2015"}),
    ({"v": {"gt": 2009, "lt": 3000}}, {"year_2015"}),
    ({"v": {"lte": 1}}, {"int_one", "float_one", "list_v"}),  # numbers only: true and "1" are not numbers
    ({"v": {"lt": "B"}}, {"str_one", "text_apple"}),  # strings by code point; "x" > "B"
    ({"v": {"in": ["Apple", 2009, False]}}, {"text_apple", "year_2009"}),
    ({"v": {"in": [True]}}, {"bool_true", "list_v"}),
    ({"tags": "finance"}, {"year_2009"}),  # an array matches when an element does
    ({"tags": {"has": "finance"}}, {"year_2009"}),
    ({"v": {"has": "x"}}, {"list_v"}),
    ({"v": {"has": "Apple"}}, set()),  # has: arrays only
    ({"v": {"ieq": "apple"}}, {"text_apple"}),
    ({"v": {"ieq": "STRASSE"}}, {"text_strasse"}),  # Unicode case folding
    ({"tags": {"ieq": "FINANCE"}}, {"year_2009", "year_2015"}),
    ({"v": {"exists": True}}, set(DOCS) - {"no_v", 'quote"key'}),  # null counts as present
    ({"v": {"exists": False}}, {"no_v", 'quote"key'}),
    ({"v": {"null": True}}, {"null", "no_v", 'quote"key'}),  # missing or null (Elasticsearch: must_not exists)
    ({"v": {"null": False}}, set(DOCS) - {"null", "no_v", 'quote"key'}),  # holds a value (Elasticsearch's exists)
    ({"v": {"not": {"null": True}}}, set(DOCS) - {"null", "no_v", 'quote"key'}),
    ({"$any": [{"v": "Apple"}, {"other": 1}]}, {"text_apple", "no_v"}),  # OR across fields
    ({"$any": [{"v": {"gte": 2009}}, {"tags": "finance"}], "v": {"lt": 2010}}, {"year_2009"}),
    ({"$any": [{"v": 1, "other": 1}, {"$any": [{"v": "Straße"}, {"v": {"null": True}, "other": {"exists": True}}]}]},
     {"text_strasse", "no_v"}),
    ({"$all": [{"$any": [{"v": 1}, {"v": "1"}]}, {"$any": [{"v": {"lt": 1.5}}, {"v": {"lt": "5"}}]}]},
     {"int_one", "float_one", "list_v", "str_one"}),
    ({"v": {"gte": 10**300}}, set()),  # the huge integer is not a number for filters
    ({"v": {"not": {"eq": 1}}}, set(DOCS) - {"int_one", "float_one", "list_v"}),  # missing fields included
    ({"v": {"not": {"in": [1, "1"]}, "exists": True}}, set(DOCS) - {"int_one", "float_one", "list_v", "str_one",
                                                                    "no_v", 'quote"key'}),
    ({"v": {"gte": 2000, "not": {"gte": 2010}}}, {"year_2009"}),
    ({"v": {"gte": 2000}, "tags": "finance"}, {"year_2009"}),  # fields AND-ed
    ({'we"ird': "ok"}, {'quote"key'}),  # any key, quotes included
    ({"v": "nothing"}, set()),
]


@pytest.fixture(scope="module")
def store():
    s = DocStore(":memory:", create=True)
    s.add((i, doc_id, "t", meta, 1.0) for i, (doc_id, meta) in enumerate(DOCS.items()))
    yield s
    s.close()


def _ids(store, filters) -> set[str]:
    positions = store.matching(filters)
    assert positions == sorted(set(positions))  # sorted, each once
    return {d["id"] for d in store.get(positions).values()}


@pytest.mark.parametrize(("filters", "expected"), TABLE, ids=[str(f) for f, _ in TABLE])
def test_filter_semantics_table(store, filters, expected):
    assert _ids(store, filters) == expected


@pytest.mark.parametrize(("filters", "message"), [
    ({"v": {"gte": True}}, "compares numbers or strings"),
    ({"v": {"ieq": 1}}, "compares strings"),
    ({"v": {"in": []}}, "list of 1"),
    ({"v": {"around": 1}}, "unknown operator 'around'"),
    ({"v": {"not": {"not": {"eq": 1}}}}, '"not" takes'),
    ({"v": {"exists": "yes"}}, "true or false"),
    ({"v": float("nan")}, "finite"),
    ({"v": None}, "not a string"),
    ({"v": {}}, "at least one operator"),
    ({"v": 10**400}, "beyond the numbers a filter compares"),
    ({"v": {"null": "yes"}}, '"null" takes true'),
])
def test_invalid_filters_name_the_field_and_the_fault(store, filters, message):
    with pytest.raises(flt.FilterError, match=message) as e:
        store.matching(filters)
    assert str(e.value).startswith("filter 'v': ")


def test_positive_filters_search_the_side_table_indexes(store):
    """Each positive operator is an index search (cost ∝ matches), never a scan of the table."""
    for filters in [{"v": 1}, {"v": {"gte": 2000, "lt": 2020}}, {"v": {"in": ["a", 1]}}, {"v": {"ieq": "x"}},
                    {"tags": {"has": "a"}}, {"v": {"exists": True}}]:
        sql, args = flt.matching_sql(flt.clauses(filters))
        plan = " | ".join(row[-1] for row in store.conn.execute("EXPLAIN QUERY PLAN " + sql, args))
        assert "SEARCH fields USING" in plan and "SCAN fields" not in plan, (filters, plan)


def test_an_older_docstore_is_refused_for_filters_with_the_way_out(tmp_path):
    path = str(tmp_path / "old.sqlite")
    conn = sqlite3.connect(path)  # a docstore as written before typed filters
    conn.executescript("CREATE TABLE docs (pos INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, text TEXT NOT NULL, "
                       "meta TEXT NOT NULL, norm REAL NOT NULL);"
                       """INSERT INTO docs VALUES (0, 'a', 't', '{"k": [1, 2]}', 1.0);""")
    conn.commit()
    conn.close()
    with pytest.raises(flt.FilterError, match="relsearch compact"):  # compact writes a new docstore with the table
        DocStore(path).matching({"k": 1})


@pytest.mark.parametrize(("spec", "parsed"), [
    ("country=US", ("country", "eq", "US", False)),
    ("n=1", ("n", "eq", 1, False)),
    ('code="1"', ("code", "eq", "1", False)),
    ("flag=true", ("flag", "eq", True, False)),
    ("country!=US", ("country", "eq", "US", True)),
    ("year>=2010", ("year", "gte", 2010, False)),
    ("year > 2010", ("year", "gt", 2010, False)),
    ("year<2.5", ("year", "lt", 2.5, False)),
    ("name<=M", ("name", "lte", "M", False)),
    ("name~=apple", ("name", "ieq", "apple", False)),
    ("name~=true", ("name", "ieq", "true", False)),  # case-insensitive compares text
    ("gics_sector in [Energy,Utilities]", ("gics_sector", "in", ["Energy", "Utilities"], False)),
    ('x in ["a,b", 1, true]', ("x", "in", ["a,b", 1, True], False)),
    ("x in [1, b]", ("x", "in", [1, "b"], False)),
    ("tags has finance", ("tags", "has", "finance", False)),
    ("ceo exists", ("ceo", "exists", True, False)),
    ("not ceo exists", ("ceo", "exists", True, True)),
    ("not year>=2010", ("year", "gte", 2010, True)),
    ("title=a in b", ("title", "eq", "a in b", False)),  # the first operator decides
    ("url=a=b>c", ("url", "eq", "a=b>c", False)),
])
def test_filter_grammar(spec, parsed):
    assert parse_filter(spec) == parsed


@pytest.mark.parametrize("spec", ["country", "=US", "x in Energy", "not ", "x in [1"])
def test_malformed_filter_expressions_are_refused(spec):
    with pytest.raises(ValueError):
        flt.clauses(merge_filters([parse_filter(spec)]))


def test_expressions_merge_per_field():
    specs = ["year>=2010", "year<2020", "not country in [US]", "country!=CA", "sector=Energy"]
    assert merge_filters([parse_filter(s) for s in specs]) == {
        "year": {"gte": 2010, "lt": 2020}, "country": {"not": {"in": ["US"], "eq": "CA"}}, "sector": "Energy"}
    with pytest.raises(ValueError, match="in \\[A,B\\]"):
        merge_filters([parse_filter("c=US"), parse_filter("c=CA")])


def test_elasticsearch_receives_the_same_operators():
    clauses = filter_clauses({"year": {"gte": 2010, "not": {"in": [2015]}}, "name": {"ieq": "apple"},
                              "ceo": {"exists": False}, "sector": "Energy"})
    assert clauses == [
        {"bool": {"must_not": [{"exists": {"field": "metadata.ceo"}}]}},
        {"term": {"metadata.name": {"value": "apple", "case_insensitive": True}}},
        {"term": {"metadata.sector": "Energy"}},
        {"range": {"metadata.year": {"gte": 2010}}},
        {"bool": {"must_not": [{"terms": {"metadata.year": [2015]}}]}},
    ]


def test_range_filter_search_returns_k_whenever_k_match(tmp_path):
    """Through Searcher: a range filter's hits are exactly the exact search's top-k among its matches,
    and a broad one (FAISS with an id selector) still returns k."""
    from relsearch.indexer.build import Block, build_published
    from relsearch.indexer.faiss_index import FaissSpec
    from relsearch.retrieval.search import Searcher

    from synthetic_index import D, encoder_identity, raw_vectors, unit

    n = 400
    docs = [{"id": f"d{i}", "text": f"t{i}", "metadata": {"year": 1900 + i % 200, "tags": ["even" if i % 2 else "odd"]}}
            for i in range(n)]
    vectors = raw_vectors(n, seed=3)
    build_published(str(tmp_path / "idx"), [Block(docs, vectors)], n=n, d=D, encoder=encoder_identity(),
                    spec=FaissSpec(factory="Flat", tune_queries=20))
    searcher = Searcher(str(tmp_path / "idx"), exact_subset_max=50)
    q = unit(raw_vectors(3, seed=9))
    t = unit(vectors)
    for filters in [{"year": {"gte": 2090}}, {"year": {"lt": 2050}, "tags": {"has": "even"}}]:
        allowed = np.asarray([i for i, d in enumerate(docs) if _python_match(d["metadata"], filters)])
        result = searcher.ann(q, 10, subset=searcher.matching(filters))
        for row in range(3):
            exact = allowed[np.argsort(-(t[allowed] @ q[row]), kind="stable")[:10]]
            assert set(result.positions[row]) == set(exact)


def _python_match(meta, filters):
    year_ok = all({"gte": meta["year"] >= v, "lt": meta["year"] < v}[op] for op, v in filters["year"].items())
    return year_ok and ("tags" not in filters or filters["tags"]["has"] in meta["tags"])


def test_a_huge_metadata_integer_is_stored_and_exists():
    """10**400 is valid JSON: the side table keeps a row (the field exists) that no number compares."""
    assert flt.stored(10**400) == ("bignum", "")
    assert ("v", "bignum", "", None, 0) in flt.fields_of({"v": 10**400})


def test_any_must_be_a_list_of_filters(store):
    for bad in [{"$any": {"v": 1}}, {"$any": []}, {"$any": [1]}, {"$any": [{}]}]:
        with pytest.raises(flt.FilterError, match=r'"\$any" takes a list of filters'):
            store.matching(bad)
    deep = {"v": 1}
    for _ in range(flt.MAX_DEPTH + 1):
        deep = {"$any": [deep]}
    with pytest.raises(flt.FilterError, match="nest at most"):
        store.matching(deep)


def _wide_store(fields: int) -> DocStore:
    s = DocStore(":memory:", create=True)
    s.add((i, f"d{i}", "t", {f"f{j}": (j if i % 2 else f"s{j}") for j in range(fields)}, 1.0) for i in range(6))
    return s


def test_the_largest_filters_allowed_never_reach_sqlites_limits():
    """MAX_CLAUSES operators of every shape (exists on as many fields, an in of three types each,
    negations, OR branches nested MAX_DEPTH deep) run; SQLite's 500-term compound SELECT limit was
    hit at about 500 operators before."""
    n = 1_024
    s = _wide_store(n)
    try:
        assert len(s.matching({f"f{j}": {"exists": True} for j in range(n)})) == 6  # before: "too many terms"
        assert flt.MAX_CLAUSES == n
        mixed = {f"f{j}": {"in": [j, f"s{j}", True]} for j in range(n // 2)}
        mixed.update({f"f{j}": {"not": {"eq": "nothing"}} for j in range(n // 2, n)})
        assert len(s.matching(mixed)) == 6
        branches = [{f"f{j}": j} for j in range(n // 2)] + [{f"f{j}": f"s{j}"} for j in range(n // 2, n)]
        assert len(s.matching({"$any": branches})) == 6
        nested = {f"f{j}": {"exists": True} for j in range(n - 2 * flt.MAX_DEPTH)}
        for j in range(flt.MAX_DEPTH):
            nested = {"$any": [nested, {f"f{j}": {"in": [0, "x"]}}]}
        assert len(s.matching(nested)) == 6
    finally:
        s.close()


def test_more_operators_than_the_bound_are_refused_before_any_sql():
    s = _wide_store(2)
    try:
        too_many = {f"f{j}": {"exists": True} for j in range(flt.MAX_CLAUSES + 1)}
        with pytest.raises(flt.FilterError, match=f"at most {flt.MAX_CLAUSES:,}"):
            s.matching(too_many)
        with pytest.raises(flt.FilterError, match=f"at most {flt.MAX_CLAUSES:,}"):
            s.matching({"$any": [{"f0": i} for i in range(flt.MAX_CLAUSES + 1)]})
    finally:
        s.close()


def test_too_many_filter_operators_are_a_request_error_naming_filters():
    from relsearch.retrieval.request import RequestError, SearchOptions

    options = SearchOptions(filters={f"f{j}": {"exists": True} for j in range(flt.MAX_CLAUSES + 1)})
    with pytest.raises(RequestError) as e:
        options.check()
    assert e.value.field == "filters"


def test_filters_that_can_never_match_are_named_with_the_quoted_form(store):
    """The side table knows each field's types: a number against strings matches nothing (or, negated,
    everything), silently but for this warning."""
    text = DocStore(":memory:", create=True)
    text.add([(0, "a", "t", {"founded": "1990", "code": "45301020", "tags": ["x"]}, 1.0),
              (1, "b", "t", {"founded": "2001", "code": "10101010", "tags": ["y"]}, 1.0)])
    try:
        warned = text.filter_warnings({"founded": {"gte": 1990}})
        assert len(warned) == 1 and "matches no document" in warned[0] and "holds no numbers" in warned[0]
        assert """--filter 'founded>="1990"'""" in warned[0]
        warned = text.filter_warnings({"code": {"not": {"eq": 45301020}}})
        assert "matches every document" in warned[0] and """--filter 'code!="45301020"'""" in warned[0]
        assert "quote the values" in text.filter_warnings({"code": {"in": [45301020, 1]}})[0]
        assert "holds no arrays" in text.filter_warnings({"code": {"has": "x"}})[0]
        assert text.filter_warnings({"$any": [{"founded": "1990"}, {"founded": 1990}]})[0].startswith("filter 'founded'")
        for fine in [{"founded": "1990"}, {"founded": {"gte": "1990"}}, {"code": {"exists": True}},
                     {"tags": {"has": "x"}}, {"founded": {"null": True}}, {"code": {"ieq": "x"}}]:
            assert text.filter_warnings(fine) == [], fine
    finally:
        text.close()
    assert store.filter_warnings({"v": 1}) == [] and store.filter_warnings({"v": {"in": ["x", 2]}}) == []
    assert "holds no strings" in store.filter_warnings({"other": "1"})[0]


@pytest.mark.parametrize(("spec", "meant"), [
    ("gics_sector == Energy", "gics_sector=Energy"), ("year=>2010", "year>=2010"), ("year=<2010", "year<=2010"),
    ("x<>1", "x!=1"), ("x!==1", "x!=1"), ("x >== 1", "x>=1"),
])
def test_doubled_operators_are_refused_with_the_right_form(spec, meant):
    with pytest.raises(ValueError, match=f"is not an operator; write {meant}"):
        parse_filter(spec)
    assert parse_filter('x="=1"') == ("x", "eq", "=1", False)  # quoted, a value may start with =


def test_null_tests_and_or_across_fields_in_the_grammar():
    assert parse_filter("ceo is null") == ("ceo", "null", True, False)
    assert parse_filter("ceo is not null") == ("ceo", "null", False, False)
    assert merge_filters([parse_filter("ceo is null")]) == {"ceo": {"null": True}}
    assert merge_filters([parse_filter("sector=Energy or founded<1950 or not ceo exists")]) == {
        "$any": [{"sector": "Energy"}, {"founded": {"lt": 1950}}, {"ceo": {"not": {"exists": True}}}]}
    assert merge_filters([parse_filter("a=1 or b=2"), parse_filter("c=3 or d=4"), parse_filter("e=5")]) == {
        "e": 5, "$all": [{"$any": [{"a": 1}, {"b": 2}]}, {"$any": [{"c": 3}, {"d": 4}]}]}
    assert parse_filter('title="War or Peace"') == ("title", "eq", "War or Peace", False)
    assert flt.fields_in(merge_filters([parse_filter("a=1 or b=2")])) == ["a", "b"]


def test_elasticsearch_receives_any_as_should_and_null_as_exists():
    assert filter_clauses({"$any": [{"a": 1}, {"b": {"null": False}}], "c": {"null": True}}) == [
        {"bool": {"should": [{"bool": {"filter": [{"term": {"metadata.a": 1}}]}},
                             {"bool": {"filter": [{"exists": {"field": "metadata.b"}}]}}], "minimum_should_match": 1}},
        {"bool": {"must_not": [{"exists": {"field": "metadata.c"}}]}},
    ]


# ------------------------------------------------------------------------------ what a filter may cost
def _nested_list(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


def test_deeply_nested_filter_text_is_one_line_naming_the_bound():
    """``--filter "founded in [[[[…3000 deep…]]]]"`` raised RecursionError (a traceback) from json.loads."""
    import click

    from relsearch.cli_query import typed_filters
    from relsearch.retrieval import inputs

    deep = "[" * 3000 + "]" * 3000
    for spec in [f"founded in {deep}", f"founded={deep}", f"tags has {deep}", f"a=1 or founded in {deep}"]:
        with pytest.raises(ValueError, match="at position [0-9]+: brackets nest more than 32 deep$"):
            parse_filter(spec)
        with pytest.raises(click.BadParameter, match="more than 32 deep"):  # the CLI's --filter: a usage error, no traceback
            typed_filters(None, None, [spec])
    inside = '"' + "[" * 100 + '"'  # brackets inside double quotes are text
    assert parse_filter(f"title={inside}") == ("title", "eq", "[" * 100, False)
    assert parse_filter("x in [[1],2]") == ("x", "in", ["[1]", 2], False)  # shallow brackets: as before
    assert inputs.MAX_FILTER_NESTING == 32


def test_a_deeply_nested_filter_value_is_refused_without_recursion():
    """The Python API's dict form: a list nested 3,000 deep as a value raised RecursionError (its repr)."""
    deep = _nested_list(3000)
    for filters in [{"founded": {"in": [deep]}}, {"founded": deep}, {"founded": {"not": {"eq": deep}}}]:
        with pytest.raises(flt.FilterError, match="filter 'founded': a list is not a string"):
            flt.clauses(filters)
    with pytest.raises(flt.FilterError, match="a tuple must be a string"):
        flt.clauses({(1, 2): 1})


def test_the_in_values_of_a_filter_are_bounded_in_all():
    """1,024 ``in`` clauses of 10,000 values each were accepted (27 s, +660 MB per search)."""
    values = list(range(flt.MAX_IN))
    assert len(flt.clauses({"a": {"in": values}})[0].value) == flt.MAX_IN  # one full in: still fine
    for filters in [{"a": {"in": values}, "b": {"in": [1]}},
                    {"a": {"in": values[:6000]}, "b": {"not": {"in": values[:6000]}}},
                    {"$any": [{"a": {"in": values[:4000]}}] * 3}]:
        with pytest.raises(flt.FilterError, match="at most 10,000 are allowed"):
            flt.clauses(filters)
    started = time.perf_counter()
    with pytest.raises(flt.FilterError, match="'in' lists hold more than 10,000 values"):
        flt.clauses({f"f{j}": {"in": values} for j in range(flt.MAX_CLAUSES)})
    assert time.perf_counter() - started < 1.0
    with pytest.raises(flt.FilterError, match="filter 'a': \"in\" takes a list of 1 to 10,000 values"):
        flt.clauses({"a": {"in": values + [1]}})
    assert flt.MAX_VALUES == 10_000


def test_shared_sub_filters_are_measured_without_expanding_them(monkeypatch):
    """A filter repeating one sub-dict (``[d] * 32``, four levels: a million operators) was expanded
    term by term (18 s) before its count was refused; now it is measured once per distinct object and
    refused before any term is built."""
    built = []
    real = flt._clause
    monkeypatch.setattr(flt, "_clause", lambda *a, **k: built.append(a) or real(*a, **k))
    small = {"x": 1}
    for _ in range(2):
        small = {"$all": [small] * 40}  # 1,600 operators, each list well within MAX_CLAUSES
    with pytest.raises(flt.FilterError, match=f"at most {flt.MAX_CLAUSES:,}"):
        flt.clauses(small)
    assert built == []  # refused before any term was built
    huge = {"x": {"in": [1, 2]}}
    for _ in range(flt.MAX_DEPTH):
        huge = {"$all": [huge] * 32}
    started = time.perf_counter()
    with pytest.raises(flt.FilterError, match="at most 1,024"):
        flt.clauses(huge)
    assert time.perf_counter() - started < 1.0 and built == []
    shared = {"x": {"gte": 1}}
    assert len(flt.clauses({"$any": [shared, shared], "$all": [shared]})) == 2  # within bounds, shared is fine


def test_a_long_run_of_spaces_in_filter_text_is_read_in_linear_time():
    """The comparison pattern backtracked over every run of spaces: 20,000 spaces took 11 s."""
    started = time.perf_counter()
    with pytest.raises(ValueError, match="cannot read filter"):
        parse_filter("a" + " " * 20_000 + "b")
    assert parse_filter("year" + " " * 20_000 + ">= 2010") == ("year", "gte", 2010, False)
    assert time.perf_counter() - started < 2.0
