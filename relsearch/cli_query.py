"""``relsearch query``: relational queries against the FAISS index or its Elasticsearch mirror.

Registered in :mod:`relsearch.cli`; kept free of imports from it so either module can load first.
"""
from __future__ import annotations

import dataclasses
import json
import sys
import textwrap

import click

from relsearch.retrieval.inputs import merge_filters, parse_filter


def _warn_if_stale_mirror(manifest, alias: str) -> None:
    """The manifest knows when the alias holds other contents than the local generation (a write
    without --es-url, or a rollback): say so before answering from it."""
    mirror = manifest.backends.get("elasticsearch") or {}
    if mirror.get("stale") and mirror.get("alias") == alias:
        click.echo(f"warning: the index's manifest marks the Elasticsearch mirror {alias} stale (a later write without "
                   "--es-url, or a rollback): its answers may differ from the local index's", err=True)


def _fail(message: str) -> None:
    raise click.ClickException(message)


def key_values(ctx, param, specs) -> dict[str, str]:
    """Click callback: repeated KEY=VALUE options → dict; a malformed one is a usage error."""
    out = {}
    for spec in specs:
        key, sep, value = spec.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expects KEY=VALUE, got {spec!r}", ctx=ctx, param=param)
        out[key] = value
    return out


def typed_filters(ctx, param, specs) -> dict:
    """Click callback for --filter: expressions → the typed JSON form of indexer/filters.py
    (retrieval/inputs.parse_filter); a malformed one is a usage error."""
    try:
        return merge_filters([parse_filter(spec) for spec in specs])
    except ValueError as e:
        raise click.BadParameter(str(e), ctx=ctx, param=param) from None


FILTER_HELP = ('Metadata filter, repeat = AND: FIELD=VALUE (typed: 1 and 2.5 numbers, true/false booleans, '
               '"1" in double quotes the string 1, other text that string), FIELD!=VALUE, FIELD>=VALUE (>, <, <=), '
               'FIELD~=TEXT (case-insensitive), "FIELD in [A,B]", "FIELD has VALUE" (array holds it), '
               '"FIELD exists"; "not " before any negates it.')


def field_names(ctx, param, specs) -> list[str] | None:
    """Click callback for --fields: comma-separated names, repeatable → a list (None when not given)."""
    if not specs:
        return None
    return list(dict.fromkeys(name.strip() for spec in specs for name in spec.split(",") if name.strip()))


def _search_params(ef_search, nprobe, rerank, extra: dict) -> dict:
    named = {"efSearch": ef_search, "nprobe": nprobe, "rerank": rerank}
    return {**extra, **{key: value for key, value in named.items() if value is not None}}


def declared_options(command):
    """The flags made from retrieval/request.py's SearchOptions declaration: each number or switch
    option (its type, default, bounds and help; a switch on by default becomes --no-NAME), and for
    each side of a query by examples an --ID[=W] and a --SIDE-text flag."""
    from relsearch.retrieval.request import SearchOptions, flag_of
    from relsearch.retrieval.search import DEFAULT_WEIGHT

    types = {"int": int, "int | None": int, "float | None": float}
    for option in reversed(dataclasses.fields(SearchOptions)):
        meta = option.metadata
        if option.type == "bool":
            on = option.default is False
            flag = flag_of(option.name) if on else "--no-" + option.name.replace("_", "-")
            command = click.option(flag, option.name, flag_value=on, default=not on, help=meta["help"])(command)
        elif option.type in types:
            kind = types[option.type]
            if meta["low"] is not None:
                kind = (click.IntRange if kind is int else click.FloatRange)(meta["low"], meta["high"])
            command = click.option(flag_of(option.name), option.name, type=kind, default=option.default,
                                   show_default=option.default is not None, help=meta["help"])(command)
    for side, weight in reversed(DEFAULT_WEIGHT.items()):
        command = click.option(f"--{side}-text", f"{side}_texts", multiple=True, metavar="TEXT",
                               help=f"A text example, {side} (repeatable).")(command)
        command = click.option(f"--{side}", f"{side}_ids", multiple=True, metavar="ID[=W]",
                               help=f"Query by examples: an indexed document, {side} (repeatable; weight {weight:g} "
                                    "unless given); the examples never come back.")(command)
    return command


@click.command()
@click.argument("text", required=False)
@click.option("--index", "index_dir", required=True, type=click.Path())
@click.option("--id", "doc_id", default=None, help="Query with an indexed document (never returned itself).")
@click.option("--queries", "queries_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help='JSONL of {"id", "text"} or {"doc_id"}, optional "relation" (name or {name: weight}).')
@click.option("--facet", "facets", multiple=True, metavar="FIELD",
              help="Count the values of metadata FIELD over the first --facet-depth hits (repeatable).")
@click.option("--relation", "-r", "relations", multiple=True, help="NAME or NAME=WEIGHT; repeat to mix.")
@click.option("--filter", "filters", multiple=True, callback=typed_filters, help=FILTER_HELP)
@click.option("--collapse", "collapse_field", default=None, metavar="FIELD",
              help="Keep only the best hit per value of metadata FIELD (e.g. one share class per company).")
@click.option("--no-collapse", "no_collapse", is_flag=True,
              help="Collapse on nothing, not even the index's recorded --collapse-field (share classes).")
@click.option("--why-not", "why_not", default=None, metavar="ID",
              help="Why is ID not higher: its rank in the whole answer and its score parts beside the last hit shown's.")
@click.option("--field", "text_field", default=None, metavar="NAME",
              help="Search one named text field of an index of several (default: all of them, each document by "
                   "its best field; the table's field column and --json's \"field\" say which).")
@click.option("--json", "as_json", is_flag=True,
              help='JSON lines: {"rank", "id", "score", "text", "metadata": {...}} per hit.')
@click.option("--format", "out_format", type=click.Choice(["table", "json", "csv"]), default=None,
              help="table (the default), json (as --json) or csv: a row per hit, query (the id or text; a --queries "
                   "line's query_id), rank, id, score, text, then each metadata field as a column (lists as JSON).")
@click.option("--fields", "fields", multiple=True, callback=field_names, metavar="F1,F2",
              help="Metadata fields each hit carries (comma-separated or repeated), in this order: columns of the "
                   "table, the only keys of --json's \"metadata\" (default: all in --json, none in the table).")
@click.option("--model", default=None, help="Relation bundle folder or model id (default: the index's bundle).")
@click.option("--ef-search", type=click.IntRange(min=1), default=None, help="HNSW efSearch (default: tuned at build).")
@click.option("--nprobe", type=click.IntRange(min=1), default=None, help="IVF lists probed (default: tuned at build).")
@click.option("--rerank", default=None, metavar="N|HEAD",
              help="N: candidates FAISS re-scores exactly from the stored vectors, 0 = off (default: tuned at "
                   "build). HEAD: a re-ranking head of the bundle (e.g. pu-head): the ANN top max(k, "
                   "--rerank-depth) re-scored by the head's P(positive), both scores shown.")
@click.option("--search-param", "search_param", multiple=True, callback=key_values,
              help="KEY=VALUE FAISS search parameter (nprobe, efSearch, rerank, max_codes, k_factor, ...).")
@click.option("--backend", type=click.Choice(["faiss", "es"]), default="faiss", show_default=True)
@click.option("--es-url", default=None, help="Elasticsearch URL for --backend es (credentials from the environment).")
@click.option("--es-index", default=None, help="Elasticsearch alias or index for --backend es.")
@click.option("--es-credentials", type=click.Path(exists=True, dir_okay=False), default=None)
@click.option("--es-ca-certs", type=click.Path(exists=True, dir_okay=False), default=None)
@click.option("--num-candidates", type=click.IntRange(min=1), default=None,
              help="Elasticsearch kNN candidates per shard (default max(100, 2k)).")
@click.option("--hybrid", type=click.Choice(["rrf", "weighted"]), is_flag=False, flag_value="rrf", default=None,
              help="Fuse BM25 on the query text (the stored text for --id) with the relational search: rrf "
                   "(reciprocal rank fusion; plain --hybrid) or weighted (min-max scores, see --hybrid-weight). "
                   "Local: the index's BM25 lists; --backend es: the server's BM25. Refused with a relation whose "
                   "recipe already fuses BM25 (docs/how-a-query-runs.md).")
@click.option("--fusion", type=click.Choice(["server", "client"]), default="server", show_default=True,
              help="--backend es --hybrid: the server's rrf retriever, or two searches fused here.")
@declared_options
def query(text, index_dir, doc_id, queries_file, relations, filters, collapse_field, as_json, out_format, fields, model,
          ef_search, nprobe, rerank, search_param, backend, es_url, es_index, es_credentials, es_ca_certs, num_candidates,
          hybrid, fusion, facets, no_collapse, text_field, why_not, **declared):
    """Find documents standing in --relation to TEXT (or to --id, to --like examples, or to each line of --queries)."""
    from relsearch.retrieval import request
    from relsearch.retrieval.es_backend import EsQueryOptions
    from relsearch.retrieval.search import DEFAULT_WEIGHT, QueryError

    if as_json and out_format not in (None, "json"):
        _fail(f"give --json or --format {out_format}, not both")
    out_format = out_format or ("json" if as_json else "table")
    if out_format == "csv" and (facets or why_not):
        _fail(f"{'--facet' if facets else '--why-not'}: a CSV holds the hits alone; use --json or the table")
    examples = {side: [_example(v) for v in declared.pop(f"{side}_ids")] + [{"text": t} for t in declared.pop(f"{side}_texts")]
                for side in DEFAULT_WEIGHT}
    if sum(x is not None for x in (text, doc_id, queries_file)) + any(examples.values()) != 1:
        _fail("give exactly one of TEXT, --id, --like examples or --queries")
    head, rerank = _parse_rerank(rerank)
    if backend == "es" and not (es_url and es_index):
        _fail("--backend es needs --es-url and --es-index")
    if no_collapse and collapse_field:
        _fail("give --collapse FIELD or --no-collapse, not both")
    options = request.SearchOptions(filters=filters, field=text_field, collapse=False if no_collapse else collapse_field,
                                    rerank=head, hybrid=hybrid, fields=fields, facets=facets, why_not=why_not, **declared)
    es = EsQueryOptions(url=es_url, index=es_index, credentials_file=es_credentials, ca_certs=es_ca_certs,
                        num_candidates=num_candidates, fusion=fusion) if backend == "es" else None
    asked = _Asked(text, doc_id, examples, queries_file)
    try:
        options.check()
        searcher = _open(index_dir, model, backend, es, _search_params(ef_search, nprobe, rerank, search_param))
        answer = _search(searcher, asked, relations, options, reranked=head is not None)
    except request.RequestError as e:
        _fail(f"{OPTION_FLAGS.get(e.field) or request.flag_of(e.field)}: {e.message}")
    except (QueryError, KeyError, ValueError, FileNotFoundError, RuntimeError) as e:
        _fail(e.args[0] if isinstance(e, KeyError) else str(e))
    _print(answer, asked, options, out_format)
    if answer.errors:
        for err in answer.errors:
            click.echo(f"{queries_file}:{err['line']}: {err['error']}", err=True)
        sys.exit(1)


@dataclasses.dataclass(frozen=True)
class _Asked:
    """What the command line asks about: one TEXT, --id, examples by side, or a --queries file."""

    text: str | None
    doc_id: str | None
    examples: dict[str, list[dict]]
    queries_file: str | None


@dataclasses.dataclass(frozen=True)
class _Answer:
    """What one run found: per query its hits, facet counts and --why-not, and the --queries lines refused."""

    searcher: object
    queries: list
    errors: list[dict]
    results: list
    counts: list[dict]
    reasons: list[dict | None]
    fused: str | None  # the score scale every query ran on, when they share one (the table's column)


def _open(index_dir, model, backend, es, search_params):
    """The searcher of --backend (a stale Elasticsearch mirror said on stderr)."""
    from relsearch.retrieval.es_backend import open_searcher

    searcher = open_searcher(index_dir, model, backend=backend, es=es, search_params=search_params)
    if backend == "es":
        _warn_if_stale_mirror(searcher.searcher.files.manifest, es.index)
    return searcher


def _search(searcher, asked: _Asked, relations, options, *, reranked: bool) -> _Answer:
    """The queries validated as the Python API and the server validate them (relsearch/api.py), planned
    and run once; warnings on stderr."""
    from relsearch.encoder.relations import parse_relation_args
    from relsearch.retrieval import request

    try:
        weights = parse_relation_args(relations)
    except ValueError as e:
        raise request.RequestError("relations", str(e)) from None
    if asked.queries_file:
        searcher.check(weights, {})
        options.check_against(searcher)
        queries, errors = _read_queries(asked.queries_file, weights, searcher)
    else:
        from relsearch.api import SearchRequest, validate_request

        req = SearchRequest(text=asked.text, id=asked.doc_id, relations=weights, **asked.examples, **vars(options))
        validate_request(searcher, req)
        queries, errors = [req.query()], []
    plan = request.plan(searcher, queries, options)
    # a filter that can never match, or a named relation's part that cannot apply, says so
    filters = options.filters
    for line in [*(searcher.filter_warnings(filters) if filters else ()), *plan.warnings]:
        click.echo(f"warning: {line}", err=True)
    results = plan.run()
    modes = {s.mode for s in plan.scorings}
    for line in searcher.no_match_warnings(filters) if queries and not any(results) else ():
        click.echo(line if line.startswith("no document") else f"warning: {line}", err=True)
    return _Answer(searcher, queries, errors, results, plan.facets(),
                   [plan.why_not(i, options.offset + options.k) for i in range(len(queries))],
                   modes.pop() if len(modes) == 1 and not reranked else None)


def _print(answer: _Answer, asked: _Asked, options, out_format: str) -> None:
    """The answer as --format says: CSV rows, JSON lines or the table (per --queries line, or the one query)."""
    from relsearch.retrieval.export import csv_text, query_label

    first, fields = options.offset + 1, options.fields
    if out_format == "csv":
        labels = [q.query_id for q in answer.queries] if asked.queries_file else [query_label(asked.text, asked.doc_id,
                                                                                                asked.examples)]
        click.echo(csv_text([(label, [h.to_json(rank) for rank, h in enumerate(hits, first)])
                             for label, hits in zip(labels, answer.results)]), nl=False)
        return
    if asked.queries_file:
        for q, hits, facet, reason in zip(answer.queries, answer.results, answer.counts, answer.reasons):
            payload = {"query_id": q.query_id, "results": [h.to_json() for h in hits],
                       **({"facets": facet} if options.facets else {}), **({"why_not": reason} if reason else {})}
            click.echo(json.dumps(payload, ensure_ascii=False) if out_format == "json"
                       else _table(hits, title=f"query {q.query_id}", first=first, fields=fields, fused=answer.fused)
                       + _facet_lines(facet) + _why_not_lines(reason))
        return
    hits = answer.results[0]
    if out_format == "json":
        for rank, hit in enumerate(hits, first):
            click.echo(json.dumps(hit.to_json(rank), ensure_ascii=False))
        if options.facets:  # one last line, after the hits: {"facets": {field: [[value, count], ...]}}
            click.echo(json.dumps({"facets": answer.counts[0]}, ensure_ascii=False))
        if options.why_not:  # and {"why_not": {...}}
            click.echo(json.dumps({"why_not": answer.reasons[0]}, ensure_ascii=False))
        return
    card = _anchor_card(answer.searcher.local, asked.text, asked.doc_id, asked.examples) if options.explain else ""
    click.echo(card + _table(hits, first=first, fields=fields, fused=answer.fused) + _facet_lines(answer.counts[0])
               + _why_not_lines(answer.reasons[0]))


def _anchor_card(searcher, text: str | None, doc_id: str | None, examples: dict[str, list[dict]]) -> str:
    """What the answer is an answer to, above --explain's table: the --id document's id and name,
    each of its texts and its other fields on one line; the query text; or the examples."""
    from relsearch.retrieval.export import query_label, stored_document

    wrap = lambda label, words: textwrap.fill(" ".join(str(words).split()), 110, initial_indent=f"  {label}: ",  # noqa: E731
                                              subsequent_indent="    ") + "\n"
    if doc_id is None:
        return f"anchor: {'text' if text is not None else 'examples'}\n" + wrap("query", query_label(text, None, examples))
    doc = stored_document(searcher, doc_id)
    if doc is None:  # validate_request refused an unknown id before the search
        return ""
    lines = f"anchor: {doc['id']}" + (f"  {doc['name']}" if doc["name"] else "") + "\n"
    lines += "".join(wrap(name, value) for name, value in doc["texts"].items())
    shown = doc["metadata"]
    return lines + (wrap("fields", " · ".join(f"{f}={_cell(v)}" for f, v in shown.items())) if shown else "")


def _why_not_lines(reason: dict | None) -> str:
    """--why-not in the table: the document's rank and parts, the last shown hit's, and the parts it trails most on."""
    if not reason:
        return ""
    if reason["rank"] is None:
        return (f"\nwhy not {reason['id']}: not among the {reason['of']:,} hits this query can return (filtered out, "
                "collapsed under a better hit, the query's own document, or past the first 10,000)")
    parts = lambda hit: "  ".join(f"{k}={v:.3f}" for k, v in hit["explain"].items())  # noqa: E731
    lines = f"\nwhy not {reason['id']}: rank {reason['rank']:,} of {reason['of']:,}, score {reason['score']:.4f}  {parts(reason)}"
    cut = reason.get("cut")
    if cut:
        lines += f"\n  rank {cut['rank']:,} ({cut['id']}, the last shown): score {cut['score']:.4f}  {parts(cut)}"
        gaps = sorted((cut["explain"].get(k, 0.0) - v, k) for k, v in reason["explain"].items()
                      if k.startswith(("recipe:", "mixture:")))
        behind = [f"{k} by {gap:.3f}" for gap, k in reversed(gaps) if gap > 0][:3]
        if behind:
            lines += "\n  behind it on " + ", ".join(behind)
    return lines


FACETS_SHOWN = 10  # values of a facet the table shows, as the page does before its "more"


def _facet_lines(facets: dict) -> str:
    """The table's facet counts: one line per field, its 10 most frequent values (--json has them all)."""
    def said(values):
        shown = ", ".join(f"{'null' if v is None else _cell(v)} {n}" for v, n in values[:FACETS_SHOWN])
        more = len(values) - FACETS_SHOWN
        return shown + (f", … {more} more (--json lists them all)" if more > 0 else "")

    return "".join(f"\nfacet {name}: {said(values)}" for name, values in facets.items())


# the flag of each SearchOptions field, for errors retrieval/request.py raises by field name
# the flag of a request field whose CLI flag retrieval/request.py's flag_of does not say, for the errors
# it raises by field name
OPTION_FLAGS = {"text": "TEXT", "id": "--id", "like": "--like", "facets": "--facet", "relations": "--relation", "filters": "--filter",
                "metadata": "--no-metadata"}


def _example(value: str) -> dict:
    """--like ID[=W]: the example's id, and its weight when the text after the last '=' is a number."""
    doc_id, sep, weight = value.rpartition("=")
    try:
        return {"id": doc_id, "weight": float(weight)} if sep and doc_id else {"id": value}
    except ValueError:  # an id holding '=': the whole value is the id
        return {"id": value}


def _parse_rerank(rerank: str | None) -> tuple[str | None, int | None]:
    """--rerank N|HEAD → (head name, None) or (None, N): a number is FAISS's exact re-scoring depth."""
    if rerank is None or rerank.strip().lstrip("+").isdigit():
        return None, None if rerank is None else int(rerank)
    if rerank.strip().startswith("-"):
        _fail(f"--rerank expects a number ≥ 0 or a head name, got {rerank!r}")
    return rerank.strip(), None


def _read_queries(path: str, weights: dict, searcher) -> tuple[list, list[dict]]:
    """The --queries file's queries (ids the index lacks left out) and its errors by line."""
    from relsearch.retrieval.queries import read_queries

    queries, errors = read_queries(path, weights, known_relations=searcher.operators)
    unknown = searcher.unknown_ids(queries)
    errors += [{"line": q.line, "error": f"doc_id {q.doc_id!r} is not in the index"} for q in queries if q.doc_id in unknown]
    return [q for q in queries if q.doc_id not in unknown], sorted(errors, key=lambda err: err["line"])


FUSED = {"rrf": "rrf", "recipe": "recipe"}  # the plan's mode (retrieval/plan.py): the score column's name
PARTS = ("mixture:", "recipe:")  # explain keys of a score's parts (an operator may be named aspect:FIELD)


def _marked(hit) -> str:
    """The hit's text with each highlighted term in [brackets] (--highlight)."""
    text, out, at = hit.text, [], 0
    for start, end in hit.highlights or ():
        out += [text[at:start], "[", text[start:end], "]"]
        at = end
    return "".join(out) + text[at:]


def _cell(value, width: int = 24) -> str:
    text = " ".join(("" if value is None else value if isinstance(value, str) else json.dumps(value)).split())
    return text[:width - 1] + "…" if len(text) > width else text


def _table(hits, title: str | None = None, first: int = 1, fields: list[str] | None = None,
           fused: str | None = None) -> str:
    """Rank, score, id, the chosen metadata ``fields`` as columns, a snippet of the text; with
    explain, a line of parts (mixture:/recipe:) and a line of every operator's score per hit.
    ``fused`` (the plan's ``rrf`` or ``recipe`` mode): the score column says so, and a note below
    the table says that fused scores are on another scale than cosines."""
    lines = [title] if title else []
    reranked = bool(hits) and hits[0].reranker is not None
    columns = [(f, max([len(f)] + [len(_cell(h.metadata.get(f))) for h in hits])) for f in fields or ()]
    matched = any(h.field is not None for h in hits)  # several text fields, fused: which text gave each score
    if matched:
        width = max(len("field"), *(len(_cell(h.field)) for h in hits))
        columns = [("field", width)] + columns
    extra = "".join(f"{f[:24]:<{w}}  " for f, w in columns)
    if reranked:  # --rerank HEAD: the head's P(positive), then the ANN score and rank it came with
        lines.append(f"{'rank':>4}  {hits[0].reranker[:7]:>7}  {'ann':>7}  {'ann#':>4}  {'id':<16}  {extra}text")
    else:
        lines.append(f"{'rank':>4}  {FUSED.get(fused, 'score'):>7}  {'id':<16}  {extra}text")
    width = 90 if not columns else 60
    for rank, h in enumerate(hits, first):
        snippet = " ".join(_marked(h).split())
        snippet = snippet[:width] + ("…" if len(snippet) > width else "")
        scores = f"{h.score:7.4f}  {h.ann_score:7.4f}  {h.ann_rank:>4}" if reranked else f"{h.score:7.4f}"
        cells = "".join(f"{_cell(h.field if matched and i == 0 else h.metadata.get(f)):<{w}}  "
                        for i, (f, w) in enumerate(columns))
        lines.append(f"{rank:>4}  {scores}  {str(h.id)[:16]:<16}  {cells}{snippet}")
        if h.explain:
            parts = {n: v for n, v in h.explain.items() if n.startswith(PARTS)}
            if parts:
                lines.append("      " + " + ".join(f"{n}={v:.3f}" for n, v in parts.items())
                             + f" = {sum(parts.values()):.3f}")
            lines.append("      " + "  ".join(f"{n}={v:.3f}" for n, v in h.explain.items() if n not in parts))
    if not hits:
        lines.append("  (no results)")
    elif fused == "rrf":
        lines.append("  rrf: fused scores, reciprocal rank fusion of the relational and BM25 ranks, Σ 1/(60 + rank) "
                     "(at most 0.033): not cosines")
    elif fused == "recipe":
        lines.append("  recipe: the dense and BM25 scores each min-max normalised over their top candidates, weighted, "
                     "plus metadata bonuses (0 to 1 + bonuses; below 0 past the candidates): not cosines")
    return "\n".join(lines)
