"""What a corpus's texts say of each of its documents, beyond their meaning: the names they use.

Mined from a generation's docstore (or any texts and names), nothing hand-listed, and read by two
consumers: completion (relsearch/completion.py: aliases, and prominence to order equal matches)
and the recipe's ``prominence`` part (retrieval/recipe.py: ``w · p(d)``, a major company kept
above a small one that shares its label). Names compare as people write them (:func:`name_words`):
case, accents and punctuation never matter, a leading article and trailing legal forms are dropped.

- aliases: a capitalised name that a document's own texts use at least ALIAS_MIN_USES times and
  that few of the corpus's texts contain ("Alphabet Inc. ... the parent company of Google": "google");
- prominence: how many other texts name the document (its name as a capitalised run), then how
  much text it has (how many texts, how long): :func:`mine`; :func:`prominence` scales it to
  [0, 1] over a generation's live documents;
- mentions: which documents name which, by the same names: the recipe's ``mentions`` part (a
  rival a company's texts name, or that names it: :meth:`Mined.mentioned`).

A generation is mined when it is written (:func:`write`, into its FILE), by every writer: an
``--append``, a delete or a compaction publishes a new one, so the figures always describe what is
live, and a query only reads them (:func:`of_generation`).
"""
from __future__ import annotations

import json
import math
import re
import threading
import unicodedata
import weakref
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from . import belonging, reader
from . import text_fields as tf

NAME_FIELDS = ("name", "title", "company", "security")  # the first a generation has is what its documents are called
# Mining reads at most this many characters of texts in all, each text's first share of it (at most
# MAX_TEXT_CHARS; the Russell 3000's three texts: 6.1M characters, 1,800 a text); where a share would be
# under MIN_TEXT_CHARS (more than ~53k texts) it reads none: no aliases, and prominence is 0 for all.
MINING_CHARS = 16_000_000
MAX_TEXT_CHARS = 4_000
MIN_TEXT_CHARS = 300
MINED_MAX_DOCS = 100_000  # a bigger generation is not mined (its texts are not read): no prominence part
ALIAS_MIN_USES = 3  # uses in a document's own texts that make a capitalised name its alias
ALIAS_MAX_SHARE = 0.01  # ... when at most this share of the corpus's texts (at least ALIAS_MIN_DF) contain it
ALIAS_MIN_DF = 5
MAX_ALIASES = 4  # aliases kept per document, the most used first
MAX_RUN_WORDS = 4  # words of a capitalised run counted as a name ("Google Cloud Platform": 1 to 3 words)
# the words that begin or end a company's name without naming it: an article, legal forms, a web
# address's ending (others write "Amazon", not "Amazon.com")
ARTICLES = frozenset({"the"})
LEGAL_FORMS = frozenset({"inc", "incorporated", "corp", "corporation", "co", "company", "companies", "plc", "ltd",
                         "limited", "llc", "lp", "llp", "holdings", "holding", "group", "sa", "ag", "nv", "se", "com"})
_SEPARATORS = re.compile(r"[\W_]+")  # what separates words: anything but a letter or digit
_CAPITALISED = r"(?<![\w'’.&-])[A-ZÀ-ÖØ-Þ][\w'’.&-]*"  # a word that starts with a capital (Latin letters)
_RUNS = re.compile(f"{_CAPITALISED}(?:(?: of| &)? {_CAPITALISED})*")
_POSSESSIVE = re.compile(r"['’]s\b")
_SENTENCE_END = re.compile(r"(?<=[.!?])(?<!\b[A-Z]\.)\s+(?=[A-Z])")  # not after an initial ("F. Hoffmann")
# A sentence of dealings between firms (a customer, supplier, partner or licensee, a deal, a spin-off,
# an owner, a listing) names a firm that is not a rival: it makes no mention (it still counts for
# prominence). Read on a sample of the Russell 3000's same-industry mentions, most that were not
# rivals were of these kinds (Boeing named by its suppliers, drug makers by their partners).
DEALINGS = re.compile(r"\b(collaborat\w*|agreements?|allian\w*|partner\w*|licens\w*|joint venture|customers?|"
                      r"clients?|suppl(y|ier|iers|ies|ied)|vendors?|distribut\w*|subsidiar\w*|spun|spin-?offs?|"
                      r"merg(ed|er|ers|ing)|acqui\w*|sold|sale|successor|formerly|renamed|stakes?|shareholders?|"
                      r"invest\w*|owned|owns|listed|ticker|components|parts|works with|contracts?|franchis\w*|bottlers?)\b", re.I)
FILE = "mined.json"  # a generation's mining, written with it (:func:`write`)
# What :func:`mine` computes, versioned: a file of another version is mined again on first use (bump
# it with any change to what mine() finds, so that an index written before follows the new rules).
VERSION = 5
_MINED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # a generation's docstore → its Mined
_MINED_LOCK = threading.Lock()


# ---------------------------------------------------------------- how names compare


def fold(text: str) -> str:
    """``text`` as completion compares it: casefolded, then accents dropped ("Nestlé" → "nestle", "İ" → "i")."""
    if text.isascii():  # most ids and names: nothing to decompose (a third of the build time)
        return text.lower()
    return "".join(c for c in unicodedata.normalize("NFKD", text.casefold()) if not unicodedata.combining(c))


def words(text: str) -> str:
    """``fold(text)`` with each run of spaces and punctuation one space and none in front: "The
    Coca-Cola Company" → "the coca cola company". A separator the prefix ends with stays (one space:
    "coca-" finds "coca cola", not "cocaine"), which is why keys carry one after the last word."""
    return _SEPARATORS.sub(" ", fold(text)).lstrip()


def name_words(text: str) -> list[str]:
    """The words that name: ``words(text)`` without a leading article or trailing legal forms, at
    least one kept ("The Coca-Cola Company" → coca, cola; "JPMorgan Chase & Co." → jpmorgan, chase)."""
    w = words(text).split()
    start, end = _naming_span(w)
    return w[start:end]


def _naming_span(w: list[str]) -> tuple[int, int]:
    start, end = 0, len(w)
    while end - start > 1 and w[start] in ARTICLES:
        start += 1
    # "and" before a legal form goes with it: "Eli Lilly and Company" is named "Eli Lilly"
    while end - start > 1 and (w[end - 1] in LEGAL_FORMS or w[end - 1] == "and" and end < len(w)):
        end -= 1
    return start, end


# ---------------------------------------------------------------- what the corpus says of each document


@dataclass
class Mined:
    """What :func:`mine` read from a corpus's texts, per document position."""

    aliases: dict[int, list[tuple[str, int]]] = field(default_factory=dict)  # position → [(alias, uses)]
    prominence: dict[int, float] = field(default_factory=dict)  # position → score (absent: 0)
    names: dict[int, set[int]] = field(default_factory=dict)  # position → the positions its texts name

    @cached_property
    def scaled(self) -> dict[int, float]:
        """:func:`scaled` prominence, computed once."""
        return scaled(self.prominence)

    @cached_property
    def named_by(self) -> dict[int, set[int]]:
        """position → the positions whose texts name it."""
        out: dict[int, set[int]] = {}
        for pos, named in self.names.items():
            for other in named:
                out.setdefault(other, set()).add(pos)
        return out

    def mentioned(self, pos: int) -> dict[int, float]:
        """position → how strongly it and ``pos`` are linked by naming, in [0, 1]: 1 when the texts of
        ``pos`` name it; when only its own texts name ``pos``, its prominence over that of ``pos``, at
        most 1. A small firm names the major whose platform it sells on, whose drug it develops or
        whose members it serves (Cars.com names Facebook, Fate Therapeutics Biogen, Quest Diagnostics
        Anthem) far more often than the major names it: such a link says little of the major's rivals,
        while one between firms of a size, or named by the major's own texts, says as much as before."""
        p = self.scaled
        own = p.get(pos, 0.0)
        out = {other: min(1.0, p.get(other, 0.0) / own) if own else 1.0 for other in self.named_by.get(pos, ())}
        return out | dict.fromkeys(self.names.get(pos, ()), 1.0)


def name_runs(text: str) -> list[list[str]]:
    """The names in ``text``: each run of capitalised words ("of" and "&" inside one) as the naming
    words (:func:`name_words`) of its first 1 to MAX_RUN_WORDS words, shortest first: "parent company
    of Google Cloud." → [["google", "google cloud"]]. Punctuation other than "." "-" "'" "&" ends a
    run, and so does a sentence's full stop (not an initial's or a legal form's: "J.P. Morgan", "Inc.")."""
    out: list[list[str]] = []
    for run in _RUNS.findall(text):
        piece: list[str] = []
        for token in run.split(" "):
            piece.append(token)
            if token.endswith(".") and token.count(".") == 1 and len(token) > 2 and token[:-1].lower() not in LEGAL_FORMS:
                out.append(_run_names(piece))  # a sentence ends there
                piece = []
        out.append(_run_names(piece))
    return [names for names in out if names]


def capitalised_runs(text: str) -> list[str]:
    """Every name of :func:`name_runs`, of every run."""
    return [name for names in name_runs(text) for name in names]


def _named_in(text: str, named: dict[str, list[int]]) -> set[str]:
    """The keys of ``named`` (naming words joined) that ``text`` names: of each run, its longest name
    that is one ("Coca-Cola Consolidated, Inc." names that bottler, not The Coca-Cola Company)."""
    out = set()
    for names in name_runs(text):
        found = [joined for joined in (name.replace(" ", "") for name in names) if joined in named]
        if found:
            out.add(found[-1])
    return out


def _run_names(tokens: list[str]) -> list[str]:
    w = words(_POSSESSIVE.sub("", " ".join(tokens))).split()
    start = 0
    while start < len(w) - 1 and w[start] in ARTICLES:
        start += 1
    found = []
    for end in range(start + 1, min(len(w), start + MAX_RUN_WORDS) + 1):
        if w[end - 1] not in LEGAL_FORMS and w[end - 1] not in ARTICLES and w[end - 1] != "of":
            found.append(" ".join(w[start:end]))
    return found


def mine(texts: dict[int, list[str]], names: dict[int, str]) -> Mined:
    """Aliases, prominence and mentions of each document from ``texts`` (position → its texts) and ``names``
    (position → name). A text held by several documents (share classes, a copied intro) counts once.

    - An alias of a document is a capitalised run (:func:`capitalised_runs`) its texts use at least
      ALIAS_MIN_USES times, contained in at most ALIAS_MAX_SHARE of the corpus's distinct texts (at
      least ALIAS_MIN_DF), that its name does not already start with; the MAX_ALIASES most used.
    - Prominence = ln(1 + other texts naming it) + ½ ln(1 + its characters of text / 1000): a text
      names a document when one of its runs is the document's naming words joined, its share class
      cut (:func:`naming_key`). A name links nobody when it is ambiguous — claimed by two issuers —
      or one word that the texts also write in lower case ("Now" of NOW Inc., "Southern", "Target"),
      as indexer/belonging.py's name matcher decides.
    - Names: what each document's texts name, in a sentence that is not of dealings between firms
      (:data:`DEALINGS`), by a run's longest linking name (:func:`_named_in`)."""
    runs = {t: capitalised_runs(t) for ts in texts.values() for t in ts}
    joined = {t: {r.replace(" ", "") for r in rs} for t, rs in runs.items()}  # "ExxonMobil" names "Exxon Mobil"
    df = Counter(r for rs in joined.values() for r in rs)
    max_df = max(ALIAS_MIN_DF, int(ALIAS_MAX_SHARE * len(runs)))
    keys = {pos: naming_key(names.get(pos, "")) for pos in texts}
    issuers: dict[str, set] = {}
    for pos, k in keys.items():
        issuers.setdefault(k, set()).add(belonging.issuer(names[pos]) if k else ())
    common = belonging.lower_case_words(runs) if any(k and " " not in k for k in keys.values()) else set()
    linking = {k for k, who in issuers.items() if k and len(who) == 1 and not (" " not in k and k in common)}
    named: dict[str, list[int]] = {}  # a linking key, spaces cut as runs are joined → its documents (share classes)
    for pos, k in keys.items():
        if k in linking:
            named.setdefault(k.replace(" ", ""), []).append(pos)
    # the names that make mentions: each run's longest linking name, outside sentences of dealings
    rivals = {t: _named_in(without_dealings(t) if DEALINGS.search(t) else t, named) for t in runs}
    out = Mined()
    for pos, own in texts.items():
        own = list(dict.fromkeys(own))
        name = "".join(name_words(names.get(pos, "")))
        uses = Counter(r for t in own for r in runs[t])
        found = [(r, n) for r, n in uses.most_common() if n >= ALIAS_MIN_USES and len(r) > 2
                 and df[r.replace(" ", "")] <= max_df and not (name and name.startswith(r.replace(" ", "")))]
        # "standard" is found by the keys of "standard oil" (alias_keys): one alias
        found = [(r, n) for r, n in found if not any(o != r and o.startswith(r + " ") for o, _ in found)]
        if found:
            out.aliases[pos] = found[:MAX_ALIASES]
        key = keys[pos].replace(" ", "")
        naming = df[key] - sum(key in joined[t] for t in own) if keys[pos] in linking else 0
        out.prominence[pos] = math.log1p(naming) + 0.5 * math.log1p(sum(map(len, own)) / 1000)
        others = {q for t in own for r in rivals[t] for q in named.get(r, ()) if keys[q] != keys[pos]}
        if others:
            out.names[pos] = others
    return out


def without_dealings(text: str) -> str:
    """``text`` without its sentences of dealings between firms (:data:`DEALINGS`)."""
    return " ".join(s for s in _SENTENCE_END.split(text) if not DEALINGS.search(s))


def naming_key(name: str) -> str:
    """The naming words of ``name`` without its share class, spaced ("Alphabet Inc Class A" →
    "alphabet"; "The Coca-Cola Company" → "coca cola"); "" for no name."""
    return " ".join(name_words(" ".join(belonging.issuer(name)))) if name and belonging.issuer(name) else ""


def read_texts(docs, text_fields: tuple[str, ...]) -> dict[int, list[str]]:
    """position → the first characters of each of its texts (``text_fields[1:]`` from the side table,
    the first from the docstore), MINING_CHARS in all at most; none where that leaves a text under
    MIN_TEXT_CHARS."""
    per_text = min(MAX_TEXT_CHARS, MINING_CHARS // max(1, docs.total * max(1, len(text_fields))))
    out: dict[int, list[str]] = {}
    if per_text < MIN_TEXT_CHARS:
        return out
    for part in docs.parts:
        for p, t in part.conn.execute("SELECT pos, substr(text, 1, ?) FROM docs", (per_text,)):
            out.setdefault(p, []).append(t)
        for name in text_fields[1:]:
            for p, t in _field_texts(part, name, per_text):
                out.setdefault(p, []).append(t)
    return out


def _field_texts(part, name: str, chars: int):
    if part.has_fields_table():
        q = "SELECT pos, substr(value, 1, ?) FROM fields WHERE field = ? AND type = 'text' AND elem = 0"
        return part.conn.execute(q, (chars, name))
    q = "SELECT pos, substr(json_extract(meta, ?), 1, ?) FROM docs"
    return [(p, v) for p, v in part.conn.execute(q, ("$." + json.dumps(name), chars)) if isinstance(v, str)]


def _names(part, name_field: str | None) -> dict[int, str]:
    """position → text value of ``name_field`` in one segment: one range scan of the side table
    (or, in an index that predates it, the stored metadata)."""
    if name_field is None:
        return {}
    if part.has_fields_table():
        q = "SELECT pos, value FROM fields WHERE field = ? AND type = 'text' AND elem = 0"
        return dict(part.conn.execute(q, (name_field,)))
    q = "SELECT pos, json_extract(meta, ?) FROM docs"
    return {p: v for p, v in part.conn.execute(q, ("$." + json.dumps(name_field),)) if isinstance(v, str)}


# ---------------------------------------------------------------- a generation's documents, mined once


def name_field(metadata_fields) -> str | None:
    """The field that names a generation's documents: the first of NAME_FIELDS it has, or None."""
    return next((f for f in NAME_FIELDS if f in metadata_fields), None)


def live_names(docs, name_field: str | None) -> dict[str, tuple[int, str]]:
    """id → (position, name) of every live document of ``docs`` (a generation's Documents; "" where
    it has no name); as Documents.positions, a later segment's live row of an id is its newest."""
    live: dict[str, tuple[int, str]] = {}
    dead = set(docs.deleted.tolist())
    for part in docs.parts:
        names = _names(part, name_field)
        live.update((i, (p, names.get(p, ""))) for p, i in part.conn.execute("SELECT pos, id FROM docs")
                    if p not in dead)
    return live


def mine_documents(docs, name_field: str, text_fields: tuple[str, ...]) -> Mined:
    """:func:`mine` of the live documents of ``docs`` (a generation's Documents), named by ``name_field``."""
    live = live_names(docs, name_field)
    texts = read_texts(docs, text_fields)
    return mine({p: texts.get(p, []) for p, _ in live.values()}, {p: n for p, n in live.values()})


def _minable(manifest, docs) -> str | None:
    """The name field a generation is mined by: None when it has none (NAME_FIELDS) or more than
    MINED_MAX_DOCS documents (its texts are not read); then the recipe's parts mined from names
    (prominence, mentions) do not apply, and completion has no aliases."""
    return None if docs.total > MINED_MAX_DOCS else name_field(manifest.fields.metadata)


def write(gen: Path, manifest) -> None:
    """Mine the new generation ``gen`` (``manifest``: its manifest, not yet written) into its FILE,
    which the manifest then lists with the other files: every writer (build, append, delete,
    compact) calls this last in its fill, so queries read what is live without mining (the Russell
    3000's three texts: ~1.5 s here, once per write). Nothing is written where nothing is mined."""
    files = reader.open_generation(gen, manifest)
    try:
        field_name = _minable(manifest, files.docstore)
        if field_name is not None:
            found = mine_documents(files.docstore, field_name, tf.names_of(manifest))
            mined = {"version": VERSION, "aliases": found.aliases, "prominence": found.prominence,
                     "names": {p: sorted(named) for p, named in found.names.items()}}
            with open(gen / FILE, "x", encoding="utf-8") as f:  # "x": never through a link to an older generation's
                json.dump(mined, f, ensure_ascii=False)
    finally:
        files.docstore.close()
        files.close_faiss_fd()


def _read(path: Path) -> Mined | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    if data.get("version") != VERSION:
        return None
    return Mined({int(p): [tuple(a) for a in found] for p, found in data["aliases"].items()},
                 {int(p): v for p, v in data["prominence"].items()},
                 {int(p): set(m) for p, m in data["names"].items()})


def of_generation(files) -> Mined | None:
    """What was mined of the generation ``files`` opened (or of the one a text field's view is
    of), None where :func:`_minable` is: its FILE, read at the first call and held while its
    docstore is open; an index written before the file existed is mined here instead."""
    files = getattr(files, "parent", None) or files
    docs = files.docstore
    field_name = _minable(files.manifest, docs)
    if field_name is None:
        return None
    with _MINED_LOCK:  # once per generation, whichever thread asks first
        if docs not in _MINED:
            _MINED[docs] = _read(files.root / FILE) if FILE in files.manifest.files else None
            if _MINED[docs] is None:  # written before the file (or this VERSION), or gone since it was opened
                _MINED[docs] = mine_documents(docs, field_name, files.text_fields)
        return _MINED[docs]


def scaled(prominence: dict[int, float]) -> dict[int, float]:
    """Each score divided by the largest, so that the most prominent document has 1 ({} when none is above 0)."""
    top = max(prominence.values(), default=0.0)
    return {p: v / top for p, v in prominence.items() if v > 0} if top > 0 else {}


def prominence(files) -> dict[int, float] | None:
    """position → prominence in (0, 1] of the live documents of a generation (absent: 0); None
    where :func:`of_generation` is."""
    found = of_generation(files)
    return None if found is None else found.scaled


def _mine_named(texts: list[list[str]], names: list[str | None]) -> Mined | None:
    """:func:`mine` of m documents given as their texts and names (bench and pack fitting: what an
    index of them mines), None when no document has a name."""
    if not any(isinstance(n, str) and n.strip() for n in names):
        return None
    return mine(dict(enumerate(texts)), {i: n for i, n in enumerate(names) if isinstance(n, str)})


def mentions_of(texts: list[list[str]], names: list[str | None]) -> np.ndarray | None:
    """(m, m) float32: how strongly document i is linked to document j by naming (:meth:`Mined.mentioned`
    of an index of them)."""
    found = _mine_named(texts, names)
    if found is None:
        return None
    out = np.zeros((len(texts), len(texts)), np.float32)
    for i in range(len(texts)):
        for j, strength in found.mentioned(i).items():
            out[i, j] = strength
    return out


def prominence_of(texts: list[list[str]], names: list[str | None]) -> np.ndarray | None:
    """(m,) float32 prominence of m documents (:func:`prominence` of an index of them)."""
    found = _mine_named(texts, names)
    if found is None:
        return None
    scores = scaled(found.prominence)
    return np.asarray([scores.get(i, 0.0) for i in range(len(texts))], np.float32)
