"""``relsearch bench transfer``: each pack relation on a second dataset of its kind that its recipe never saw.

A relation's recipe is chosen on its own dev split and judged on its own test (tools/build_pack.py);
whether it carries over is another question. For each relation of :data:`TRANSFER_SETS` that the
bundle ships, the transfer set's corpus is indexed with the bundle (``relsearch index``'s pipeline,
exact FAISS search) and every query is asked of that index through the query plan
(retrieval/request.py, as ``relsearch query`` runs it) four ways:

- ``relation``: ``--relation NAME``, i.e. the relation's stored recipe;
- ``identity``: plain cosine (no relation);
- ``hybrid``: plain cosine fused with BM25 by RRF (``--hybrid``);
- ``bm25``: the index's BM25 alone.

Whole corpus: each query ranks every document of the set (``--id`` queries leave out their own
document, as ``query --id`` does). Filtered MRR over every (query, gold) pair: a gold's rank counts
only the non-gold documents above it; a gold past the first ``DEPTH`` hits counts 0 (1/1,000 at
most). Also hits@10 (filtered) and each query's first relevant hit (answer selection's MRR).

Transfer sets (``--data`` roots are searched in order for each folder; see each loader):

- duplicate-question: qatarliving_dupq (tools/data/qatarliving_dupq.py), every duplicate of dev and
  test, original question → forum question, over its 632 questions (:data:`DUPLICATE_FORUMS` adds
  qatarliving2_dupq, tools/data/qatarliving2_dupq.py, and meta_se_dupq's test, measured one at a time);
- qa-entailment: wikiqa test (tools/data/wikiqa.py), question → answer sentence, over its 5,951
  sentences;
- same-caption: sts12_16's 2014 "images" pairs (PASCAL captions) scored ≥ 4 of 5, both directions,
  over its 1,112 sentences;
- contradiction: snli test (tools/data/snli.py), premise → contradicting hypothesis, over its
  1,674 sentences;
- similar-company: sp500_companies (2024 Yahoo summaries), each company → the companies of its GICS
  sub-industry, over its 500 distinct summaries; the index holds no GICS field, so the recipe's
  GICS bonuses cannot use the gold (its cosine and BM25 parts are judged);
- aspect:sector, aspect:industry (AspectCSE operators, trained on Russell 3000's 2020 Yahoo texts):
  the same S&P 500 index, each company → the companies of its GICS sector / industry (the S&P 500
  set has sub-industry names only: each takes the industry most of its companies have in the
  Russell 3000 set). Not leak-free: most S&P 500 companies are Russell 3000 training companies,
  described there by older Yahoo texts.

A relation whose bundle entry has no whole-corpus test (no recipe was fitted: the aspects) is also
measured on its own test split the same way (:data:`OWN_TESTS`: the Russell 3000 test companies),
so that its own figure stands beside identity, BM25 and the hybrid as the others' do.

``--write-pack DIR`` stores each figure in DIR/bundle.json as the relation's ``transfer`` entry
(dataset, metric, relation / identity / bm25 / hybrid, hits@10, queries, candidates, date, commit,
command), an own-test measurement as its ``whole_corpus.test``, and rewrites the "Transfer"
section of DIR/MODEL_CARD.md; ``relsearch relations`` and the explorer's relations panel show
them, and say when a relation loses (retrieval/verdicts.py).
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import re
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..encoder.bundle import MANIFEST, load_bundle
from ..files import replaced_atomically
from ..retrieval.verdicts import describe_transfer, losses, own_metric
from .report import BenchInputError, BenchResult, Table, file_fingerprint, finish, read_jsonl

DEPTH = 1000  # hits asked per query: a gold past them adds at most 1/DEPTH to its reciprocal rank
BATCH = 256  # queries per plan
METHODS = ("relation", "identity", "bm25", "hybrid")
CARD_HEADING = "## Transfer: what `--relation NAME` runs on a dataset its recipe never saw"


@dataclass(frozen=True)
class Task:
    """One transfer set as an index and its queries: ``documents`` ({"id", "text", ...metadata}),
    each query an indexed document's id (``--id``) or a text, with the ids of its gold documents."""

    documents: list[dict]
    queries: list[dict]  # {"id": str} or {"text": str}, and "gold": list of document ids
    note: str = ""


@dataclass(frozen=True)
class TransferSet:
    relation: str
    dataset: str  # as shown: "WikiQA test"
    folder: str  # under a --data root
    load: Callable[[Path], Task]


@dataclass(frozen=True, kw_only=True)
class TransferJob:
    data: tuple[str, ...] = ()  # roots holding the dataset folders; () → $RELSEARCH_DATA or ../shared/data
    model: str | None = None  # the bundle (default: the shipped pack)
    relations: tuple[str, ...] = ()  # () → every relation of TRANSFER_SETS the bundle ships
    work: str | None = None  # where the transfer indexes are built (default: a temporary folder)
    write_pack: str | None = None  # store the figures in this bundle folder
    precision: str = "auto"
    progress: bool = False
    sets: dict = field(default_factory=dict)  # relation → TransferSet, overriding TRANSFER_SETS (tests)
    own_tests: dict | None = None  # relation → TransferSet, overriding OWN_TESTS (tests)


# ---------------------------------------------------------------- the transfer sets

def _ids(texts) -> dict[str, str]:
    """Each distinct text → a stable id ``t<n>`` in first-seen order."""
    return {t: f"t{i}" for i, t in enumerate(dict.fromkeys(texts))}


def _pairs_task(texts: list[str], pairs: list[tuple[str, str]], *, by_id: bool, note: str) -> Task:
    """Documents = ``texts``; one query per distinct head, its gold = its tails (itself never).
    ``by_id``: the heads are documents and are asked as ``--id``; else as texts."""
    ids = _ids(texts)
    gold: dict[str, set[str]] = {}
    for head, tail in pairs:
        if head != tail and tail in ids and (head in ids or not by_id):
            gold.setdefault(head, set()).add(ids[tail])
    queries = [{"id": ids[h]} if by_id else {"text": h} for h in gold]
    for q, g in zip(queries, gold.values()):
        q["gold"] = sorted(g)
    return Task([{"id": i, "text": t} for t, i in ids.items()], queries, note)


def qatarliving(folder: Path) -> Task:
    corpus = [r["text"] for r in read_jsonl(folder / "corpus.jsonl")]
    pairs = [(t["head"], t["tail"]) for t in read_jsonl(folder / "triples/all.jsonl")]
    return _pairs_task(corpus, pairs, by_id=True,
                       note="original question → its PerfectMatch forum questions (dev + test), over every question")


def meta_se_test(folder: Path) -> Task:
    """meta_se_dupq's test duplicates, both ways, over every question of its corpus: the pack's own
    test (its recipe is chosen on train + dev), a transfer set only for a recipe chosen elsewhere."""
    corpus = [r["text"] for r in read_jsonl(folder / "corpus.jsonl")]
    pairs = [p for t in read_jsonl(folder / "triples/test.jsonl") for p in ((t["head"], t["tail"]), (t["tail"], t["head"]))]
    return _pairs_task(corpus, pairs, by_id=True, note="test question → its duplicates (both ways), over every question")


def wikiqa(folder: Path) -> Task:
    sentences = [r["text"] for r in read_jsonl(folder / "sentences/test.jsonl")]
    pairs = [(t["head"], t["tail"]) for t in read_jsonl(folder / "triples/test.jsonl")]
    return _pairs_task(sentences, pairs, by_id=False,
                       note="test question (text) → its answer sentences, over every test sentence")


def sts_images(folder: Path) -> Task:
    rows = [r for r in read_jsonl(folder / "pairs/test.jsonl") if r.get("dataset") == "images" and r.get("year") == "2014"]
    texts = [t for r in rows for t in (r["a"], r["b"])]
    pairs = [p for r in rows if r["score"] >= 4 for p in ((r["a"], r["b"]), (r["b"], r["a"]))]
    return _pairs_task(texts, pairs, by_id=True,
                       note="STS 2014 images: caption → captions scored >= 4 of 5 with it, over every caption")


def snli(folder: Path) -> Task:
    sentences = [r["text"] for r in read_jsonl(folder / "sentences/test.jsonl")]
    pairs = [(t["head"], t["tail"]) for t in read_jsonl(folder / "triples/test.jsonl") if t["relation"] == "contradiction"]
    return _pairs_task(sentences, pairs, by_id=True,
                       note="premise → its contradicting hypotheses, over every test sentence")


def _companies(folder: Path) -> list[dict]:
    """S&P 500 companies with a summary, one per distinct text (share classes: the first id)."""
    rows = [r for r in read_jsonl(folder / "corpus.jsonl") if isinstance(r.get("text"), str) and r["text"].strip()]
    return list({r["text"]: r for r in reversed(rows)}.values())[::-1]


def _same_label(rows: list[dict], labels: dict[str, str | None], note: str) -> Task:
    """Each company whose label another company shares (``--id``) → those companies; the index holds
    the texts and names only, so no metadata bonus can read the label."""
    members: dict[str, list[str]] = {}
    for r in rows:
        if labels.get(r["id"]):
            members.setdefault(labels[r["id"]], []).append(r["id"])
    queries = [{"id": r["id"], "gold": [i for i in members[labels[r["id"]]] if i != r["id"]]}
               for r in rows if len(members.get(labels.get(r["id"]), ())) > 1]
    return Task([{"id": r["id"], "text": r["text"], "name": r.get("name")} for r in rows], queries, note)


def sp500(folder: Path) -> Task:
    rows = _companies(folder)
    return _same_label(rows, {r["id"]: r.get("gics_sub_industry") for r in rows},
                       "company (--id) → the other companies of its GICS sub-industry, over every company; no GICS "
                       "field in the index")


def sp500_sector(folder: Path) -> Task:
    rows = _companies(folder)
    return _same_label(rows, {r["id"]: r.get("gics_sector") for r in rows},
                       "company (--id) → the other companies of its GICS sector, over every company")


def sp500_industry(folder: Path) -> Task:
    """GICS industry is not in the S&P 500 set: each sub-industry name takes the industry that the
    Russell 3000 set (2020 codes, beside it under the same root) gives most of its companies."""
    russell = folder.parent / "russell3000_companies" / "corpus.jsonl"
    if not russell.is_file():
        raise BenchInputError(f"{russell} is needed beside {folder} (GICS industries of the S&P 500 sub-industries)")
    industry = {r["id"]: r.get("gics_industry") for r in read_jsonl(russell)}
    rows = _companies(folder)
    votes: dict[str, Counter] = {}
    for r in rows:
        if r.get("gics_sub_industry") and industry.get(r["id"]):
            votes.setdefault(r["gics_sub_industry"], Counter())[industry[r["id"]]] += 1
    of_sub = {sub: max(sorted(v), key=v.__getitem__) for sub, v in votes.items()}  # ties: the first name
    return _same_label(rows, {r["id"]: of_sub.get(r.get("gics_sub_industry")) for r in rows},
                       "company (--id) → the other companies of its GICS industry (sub-industry → industry by the "
                       "Russell 3000 set's codes), over every company")


def russell_test(field: str) -> Callable[[Path], Task]:
    """The Russell 3000 test companies (the aspects' own test split, AspectCSE's pool): each → the
    other test companies sharing its ``field``."""
    def load(folder: Path) -> Task:
        rows = [r for r in _companies(folder) if r.get("split") == "test"]
        return _same_label(rows, {r["id"]: r.get(field) for r in rows},
                           f"test company (--id) → the other test companies of its {field}, over every test company")
    return load


TRANSFER_SETS = {s.relation: s for s in (
    TransferSet("duplicate-question", "Qatar Living forum (SemEval-2016 3B)", "qatarliving_dupq", qatarliving),
    TransferSet("qa-entailment", "WikiQA test", "wikiqa", wikiqa),
    TransferSet("same-caption", "STS 2014 image captions", "sts12_16", sts_images),
    TransferSet("contradiction", "SNLI test subset", "snli", snli),
    TransferSet("similar-company", "S&P 500 (GICS sub-industry)", "sp500_companies", sp500),
    TransferSet("aspect:sector", "S&P 500 (GICS sector)", "sp500_companies", sp500_sector),
    TransferSet("aspect:industry", "S&P 500 (GICS industry)", "sp500_companies", sp500_industry),
)}
# Every duplicate-question forum at hand, one transfer set each (docs/results.md, "Transfer to other
# datasets", has a row per forum): TransferJob(relations=("duplicate-question",), sets={"duplicate-question":
# DUPLICATE_FORUMS[folder]}) measures one. qatarliving2_dupq holds every original question of
# qatarliving_dupq and 14 more (the same forum, 113 duplicate pairs instead of 90).
DUPLICATE_FORUMS = {s.folder: s for s in (
    TRANSFER_SETS["duplicate-question"],
    TransferSet("duplicate-question", "Qatar Living forum (SemEval-2016 3B, train part 2 + dev)", "qatarliving2_dupq",
                qatarliving),
    TransferSet("duplicate-question", "meta.stackexchange test (the pack's own)", "meta_se_dupq", meta_se_test),
)}
# A relation whose bundle entry has no whole-corpus test (no recipe fitted: the aspect operators) is
# measured on its own test split the same way, so that its own figure also stands beside identity,
# BM25 and the hybrid; stored as its ``whole_corpus.test`` ("recipe" = what --relation runs: the operator).
OWN_TESTS = {s.relation: s for s in (
    TransferSet("aspect:sector", "Russell 3000 test (GICS sector)", "russell3000_companies", russell_test("gics_sector")),
    TransferSet("aspect:industry", "Russell 3000 test (GICS industry)", "russell3000_companies",
                russell_test("gics_industry")),
)}


# ---------------------------------------------------------------- measuring

def _roots(job: TransferJob) -> list[Path]:
    return [Path(d) for d in (job.data or (os.environ.get("RELSEARCH_DATA") or "../shared/data",))]


def find_folder(roots: list[Path], name: str) -> Path:
    for root in roots:
        if (root / name).is_dir():
            return root / name
    raise BenchInputError(f"dataset folder {name!r} is in none of the --data roots ({', '.join(map(str, roots))}); "
                          "tools/data/ has the script that makes it")


def filtered_ranks(ranked: list[str], gold: set[str]) -> dict[str, int]:
    """Each gold's rank among ``ranked`` ids, counting only the non-gold ids above it."""
    out, others = {}, 0
    for doc in ranked:
        if doc in gold:
            out.setdefault(doc, others + 1)
        else:
            others += 1
    return out


def reciprocal_ranks(lists: list[list[str]], golds: list[list[str]]) -> list[float]:
    """1 / filtered rank of every (query, gold) pair in order, 0 for a gold missing from its list."""
    out = []
    for ranked, gold in zip(lists, golds):
        ranks = filtered_ranks(ranked, set(gold))
        out += [1.0 / ranks[g] if g in ranks else 0.0 for g in gold]
    return out


def paired_se(a: list[float], b: list[float]) -> float:
    """Standard error of the mean of the paired differences a − b."""
    n = len(a)
    if n < 2:
        return float("nan")
    d = [x - y for x, y in zip(a, b)]
    mean = sum(d) / n
    return (sum((x - mean) ** 2 for x in d) / (n - 1) / n) ** 0.5


def score_lists(lists: list[list[str]], golds: list[list[str]]) -> dict[str, float]:
    """Filtered MRR and hits@10 over every (query, gold) pair, and MRR of each query's first
    relevant hit; a gold missing from its list counts 0."""
    rr, hits, first = [], [], []
    for ranked, gold in zip(lists, golds):
        ranks = filtered_ranks(ranked, set(gold))
        for g in gold:
            r = ranks.get(g)
            rr.append(1.0 / r if r else 0.0)
            hits.append(1.0 if r and r <= 10 else 0.0)
        found = [i for i, doc in enumerate(ranked) if doc in set(gold)]
        first.append(1.0 / (found[0] + 1) if found else 0.0)
    n = max(len(rr), 1)
    return {"mrr": sum(rr) / n, "hits@10": sum(hits) / n, "first_hit": sum(first) / max(len(first), 1)}


def build_index(task: Task, folder: Path, bundle, precision: str, progress: bool) -> str:
    """The task's documents indexed with the bundle, exact FAISS search; reused when built from the
    same documents with a bundle of the same fingerprint (encoder and operator tensors: a changed
    recipe needs no new index, a changed encoder does)."""
    from ..indexer.reader import open_index
    from ..pipelines.index import IndexJob, run_index

    folder.mkdir(parents=True, exist_ok=True)
    corpus, stamp, index = folder / "corpus.jsonl", folder / "bundle.fingerprint", folder / "index"
    text = "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in task.documents)
    try:
        built = (corpus.read_text(encoding="utf-8") == text and stamp.read_text() == bundle.fingerprint
                 and open_index(index).manifest is not None)
    except (OSError, ValueError):
        built = False
    if not built:
        corpus.write_text(text, encoding="utf-8")
        report = run_index(IndexJob(input=str(corpus), index=str(index), model=bundle.path or bundle.ref,
                                    faiss_factory="Flat", precision=precision, progress=progress))
        if not report.published or report.rejected:
            raise BenchInputError(f"indexing {corpus} failed: {report.indexed} indexed, {report.rejected} rejected")
        stamp.write_text(bundle.fingerprint)
    return str(index)


def ask(index: str, model: str | None, task: Task, relation: str, precision: str) -> tuple[dict, list[str]]:
    """Every method's scores on ``task`` (:func:`score_lists`), and the plan's warnings."""
    from ..retrieval.request import SearchOptions, plan
    from ..retrieval.search import Query, Searcher

    searcher = Searcher(index, model, precision=precision)
    n = searcher.live_count
    k = min(DEPTH, n)
    docs = searcher.files.docstore.get(list(range(n)))
    id_at = [docs[p]["id"] for p in range(n)]
    golds = [q["gold"] for q in task.queries]
    out, warnings = {}, []
    for method in METHODS:
        lists: list[list[str]] = []
        for start in range(0, len(task.queries), BATCH):
            part = task.queries[start:start + BATCH]
            queries = [Query(text=q.get("text"), doc_id=q.get("id"),
                             relations={relation if method == "relation" else "identity": 1.0}) for q in part]
            if method == "bm25":  # the index's BM25 alone, the query's own document left out
                own = searcher.own_positions(queries)
                result = searcher.lexical_search(searcher.query_texts(queries), k + 1)
                lists += [[id_at[p] for p in row if p >= 0 and p != o][:k] for row, o in zip(result.positions, own)]
                continue
            options = SearchOptions(k=k, hybrid="rrf" if method == "hybrid" else None, metadata=False)
            planned = plan(searcher, queries, options)
            warnings += planned.warnings
            lists += [[hit.id for hit in row] for row in planned.run()]
        out[method] = {**score_lists(lists, golds), "rr": reciprocal_ranks(lists, golds)}
    return out, list(dict.fromkeys(warnings))


def commit_of(where: Path) -> str | None:
    """The checkout's commit (short), with ``+dirty`` when tracked files changed; None outside git."""
    try:
        head = subprocess.run(["git", "-C", str(where), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def entry(tset: TransferSet, task: Task, scores: dict, command: str, commit: str | None) -> dict:
    """The bundle's ``transfer`` entry for one relation."""
    return {"dataset": tset.dataset, "folder": tset.folder, "metric": "mrr",
            **{m: round(scores[m]["mrr"], 4) for m in METHODS},
            "hits@10": {m: round(scores[m]["hits@10"], 4) for m in METHODS},
            "first_hit": {m: round(scores[m]["first_hit"], 4) for m in METHODS},
            "queries": len(task.queries), "pairs": sum(len(q["gold"]) for q in task.queries),
            "candidates": len(task.documents), "protocol": task.note,
            "date": _dt.date.today().isoformat(), "commit": commit, "command": command}


def run_transfer(job: TransferJob, *, json_out: str | None = None, plot_out: str | None = None,
                 command: str | None = None, clock=time.perf_counter) -> BenchResult:
    started = clock()
    bundle = load_bundle(job.model)
    sets = job.sets or TRANSFER_SETS
    wanted = _wanted(job.relations, bundle, sets)
    own_sets = OWN_TESTS if job.own_tests is None else job.own_tests
    own_wanted = [r for r in wanted if r in own_sets and not _has_own_test(bundle.operators[r])]
    roots = _roots(job)
    folders = {r: find_folder(roots, sets[r].folder) for r in wanted}  # every folder checked before any work
    own_folders = {r: find_folder(roots, own_sets[r].folder) for r in own_wanted}
    commit = commit_of(Path(__file__).resolve().parent)
    entries, own, inputs, rows = {}, {}, {}, []
    with tempfile.TemporaryDirectory(prefix="relsearch-transfer-") as tmp:
        work = Path(job.work or tmp)

        def measure(name: str, tset: TransferSet, folder: Path) -> dict:
            task = tset.load(folder)
            if not task.queries:
                raise BenchInputError(f"{folder}: no query with a gold document for {name}")
            t0 = clock()
            place = work / (tset.folder + ("" if tset is sets.get(name) else "-own-test"))
            index = build_index(task, place, bundle, job.precision, job.progress)
            scores, warnings = ask(index, bundle.path or job.model, task, name, job.precision)
            inputs[f"{name} {tset.dataset}"] = file_fingerprint(place / "corpus.jsonl")
            return dict(entry(tset, task, scores, command or "", commit), warnings=warnings,
                        seconds=round(clock() - t0, 1),
                        paired_se={m: round(paired_se(scores["relation"]["rr"], scores[m]["rr"]), 4) for m in METHODS[1:]})

        for name in own_wanted:
            own[name] = e = measure(name, own_sets[name], own_folders[name])
            rows.append([f"{name} (own test)", e["dataset"], e["queries"], e["candidates"], *(e[m] for m in METHODS),
                         e["hits@10"]["relation"], e["hits@10"]["identity"],
                         "; ".join(losses({"whole_corpus": {"test": as_whole_corpus(e)}})) or "wins"])
        for name in wanted:
            entries[name] = e = measure(name, sets[name], folders[name])
            rows.append([name, e["dataset"], e["queries"], e["candidates"], *(e[m] for m in METHODS),
                         e["hits@10"]["relation"], e["hits@10"]["identity"], "; ".join(losses({"transfer": e})) or "wins"])
    table = Table("transfer: each relation as --relation NAME runs it, on a dataset its recipe never saw "
                  "(whole corpus, filtered MRR)",
                  ["relation", "dataset", "queries", "texts", "relation MRR", "identity", "BM25", "hybrid",
                   "H@10 rel", "H@10 id", "verdict"], rows,
                  note="MRR over every (query, gold) pair; BM25 = the index's BM25; hybrid = identity + BM25 by RRF; the "
                       "JSON has hits@10, first-hit MRR and the paired standard error of relation − each rival")
    res = finish("transfer", {"relations": entries, "own_tests": own, "depth": DEPTH}, [table], inputs=inputs,
                 bundle=bundle, command=command, started=started, clock=clock, json_out=json_out,
                 precision=job.precision)
    if job.write_pack:
        write_pack(job.write_pack, {n: {k: v for k, v in e.items() if k not in ("warnings", "seconds", "paired_se")}
                                    for n, e in entries.items()},
                   {n: as_whole_corpus(e) for n, e in own.items()})
    return res


def _wanted(relations: tuple[str, ...], bundle, sets: dict[str, TransferSet]) -> list[str]:
    """The relations to measure: those asked for (default: every one with a transfer set) that the
    bundle ships; one asked for without a set or absent from the bundle, or none at all, is refused."""
    unknown = [r for r in relations if r not in sets]
    if unknown:
        raise BenchInputError(f"no transfer set for {', '.join(unknown)}; known: {', '.join(sorted(sets))}")
    absent = [r for r in relations if r not in bundle.operators]
    if absent:
        raise BenchInputError(f"the bundle has no relation {', '.join(absent)}; it has "
                              f"{', '.join(sorted(bundle.operators))}")
    wanted = [r for r in (relations or sorted(sets)) if r in bundle.operators]
    if not wanted:
        raise BenchInputError(f"the bundle ships none of the relations with a transfer set ({', '.join(sorted(sets))})")
    return wanted


def _has_own_test(op) -> bool:
    corpus = op.info.get("whole_corpus")
    return isinstance(corpus, dict) and isinstance(corpus.get("test"), dict) and "measured_by" not in corpus["test"]


def as_whole_corpus(e: dict) -> dict:
    """An own-test measurement as a ``whole_corpus.test`` entry (retrieval/recipe_fit.py's keys:
    the relation as run is both the "recipe" and the "operator"), marked as this bench's."""
    return {"recipe": e["relation"], "operator": e["relation"], **{m: e[m] for m in METHODS[1:]},
            "first_hit": dict(e["first_hit"], recipe=e["first_hit"]["relation"]), "queries": e["queries"],
            "candidates": e["candidates"], "dataset": e["dataset"], "protocol": e["protocol"],
            "measured_by": "relsearch bench transfer", "date": e["date"], "commit": e["commit"]}


# ---------------------------------------------------------------- the pack

def write_pack(folder: str, entries: dict[str, dict], own_tests: dict[str, dict] | None = None) -> None:
    """Store ``entries`` (relation → transfer entry) in ``folder``'s bundle.json, and ``own_tests``
    (relation → whole-corpus test of a relation without one), each relation's other fields untouched
    (written aside, then renamed over), and rewrite MODEL_CARD.md's transfer section from the whole bundle."""
    path = Path(folder) / MANIFEST
    manifest = json.loads(path.read_text(encoding="utf-8"))
    for op in manifest["operators"]:
        if op["name"] in entries:
            op["transfer"] = entries[op["name"]]
        if op["name"] in (own_tests or {}):
            op["whole_corpus"] = {**(op.get("whole_corpus") or {}), "test": own_tests[op["name"]]}
    with replaced_atomically(path) as tmp:
        tmp.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    path.chmod(0o644)
    card = Path(folder) / "MODEL_CARD.md"
    if card.is_file():
        with replaced_atomically(card) as tmp:
            tmp.write_text(with_card_section(card.read_text(encoding="utf-8"), card_section(load_bundle(folder))),
                           encoding="utf-8")
        card.chmod(0o644)


def card_section(bundle) -> str:
    """Markdown: each relation's own test and transfer figures beside identity, BM25 and the
    hybrid, and where it loses."""
    lines = [CARD_HEADING, "",
             "Measured by `relsearch bench transfer` (bench/transfer.py): the set indexed with this bundle, each query "
             "asked through the query plan as `relsearch query` asks it; whole corpus, filtered MRR over every (query, "
             "gold) pair. Own test: the recipe table above (whole-corpus test); an operator without a recipe (the "
             "aspects) is measured by this bench on its own test split the same way.", "",
             "| relation | set | relation | identity | BM25 | hybrid | queries | texts | measured | verdict |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|---|"]
    def cell(scores: dict, key: str) -> str:
        return f"{scores[key]:.3f}" if isinstance(scores.get(key), (int, float)) else "—"

    for name, op in sorted(bundle.operators.items()):
        corpus = op.info.get("whole_corpus")
        test = corpus.get("test") if isinstance(corpus, dict) else None
        transfer = op.info.get("transfer")
        if not isinstance(transfer, dict):
            continue
        verdict = "; ".join(losses(op.info)) or "beats every rival measured, on both"
        if isinstance(test, dict):
            where = f"own test: {test['dataset']}" if isinstance(test.get("dataset"), str) else "own test"
            lines.append(f"| {name} | {where} | {cell(test, 'recipe')} | {cell(test, 'identity')} | "
                         f"{cell(test, 'bm25')} | {cell(test, 'hybrid')} | {test.get('queries', '')} | "
                         f"{test.get('candidates', '')} | | |")
        elif own_metric(op.info.get("metrics")):
            metric, scores = own_metric(op.info["metrics"])
            counts = op.info["metrics"]
            lines.append(f"| {name} | own test ({metric}) | {cell(scores, 'trained')} | {cell(scores, 'identity')} | "
                         f"{cell(scores, 'bm25')} | {cell(scores, 'hybrid')} | {counts.get('queries', '')} | "
                         f"{counts.get('candidates', '')} | | |")
        if isinstance(transfer, dict) and describe_transfer(transfer):
            lines.append(f"| {name} | {transfer.get('dataset')} | {transfer['relation']:.3f} | {transfer['identity']:.3f} | "
                         f"{transfer['bm25']:.3f} | {transfer['hybrid']:.3f} | {transfer.get('queries', '')} | "
                         f"{transfer.get('candidates', '')} | {transfer.get('date', '')} at {transfer.get('commit', '')} "
                         f"| {verdict} |")
        else:
            lines.append(f"| {name} | transfer entry incomplete | | | | | | | | {verdict} |")
    command = next((op.info["transfer"].get("command") for op in bundle.operators.values()
                    if isinstance(op.info.get("transfer"), dict) and op.info["transfer"].get("command")), None)
    if command:
        lines += ["", f"Command: `{command}`"]
    return "\n".join(lines) + "\n"


def with_card_section(card: str, section: str) -> str:
    """``card`` with its transfer section replaced by ``section`` (appended when it has none)."""
    start = card.find(CARD_HEADING)
    if start < 0:
        return card.rstrip("\n") + "\n\n" + section
    following = re.search(r"^## ", card[start + len(CARD_HEADING):], re.M)
    end = len(card) if following is None else start + len(CARD_HEADING) + following.start()
    return card[:start] + section + ("\n" + card[end:] if end < len(card) else "")
