"""Texts that belong: find a corpus's texts that are about *another* record of the same corpus.

Scraped company corpora attach pages to the wrong company: the Russell 3000 set gives Chase
Corporation (CCF) the Wikipedia intro of JPMorgan Chase's bank, and 18 companies of other names
Alphabet's. Indexed as a text of its own, such a text makes Chase Corporation a peer of every
bank. ``relsearch index`` runs :func:`misattributed` over every record's name and texts before
encoding, and a flagged text is left out of that record's vectors (pipelines/index.py).

Nothing is hand-listed: the names come from the corpus's name field. A name is known by its
tokens (lower case, ``&`` kept, "V.F." = "VF") in full and in short (:func:`short_name`: "The"
and legal suffixes cut, "JPMorgan Chase & Co." → "JPMorgan Chase"); a short form claimed by
several names is ambiguous, and a one-word short form that the corpus also writes in lower case
("First", "Target") is too common: either names nobody. Records of one :func:`issuer` (one name
up to a share class: GOOG and GOOGL, "Class A" and "Class C") keep their shared texts. A text of
record R is flagged when

- **its subject** is another issuer: the text's first phrase (up to its first ``,``, ``(``,
  ``;``, ``:``, sentence end, or "is", "was", "are", "were") starts with another issuer's name,
  matched at its longest, and no less of R's own name ("Apple Hospitality" is not about Apple
  Inc.); a one-word short name must be the whole phrase ("Hudson Yards" is not Hudson Ltd.); or
- it is **identical or near-identical** (same tokens, or a Jaccard of word 4-shingles ≥
  :data:`NEAR`) to a text of another issuer that it names, and it does not name R (the other's
  text must be its own: naming it, not flagged by its subject); or
- it is held **verbatim by issuers of other names** and names none of them (a page that belongs
  to none of its holders, as the old ``tools/data/misattributed_texts.py`` repair found), unless
  it is a placeholder of under :data:`MIN_SHARED_TOKENS` words; or
- it **names its record nowhere** while the record's other texts do (:meth:`_Corpus.names_own`:
  its name in full or short, glued or by initials, its first word, its id) and its subject is not
  one the other texts name (a former name: "Seattle Genetics" of Seagen): Gladstone Commercial's
  "This is a list of bottling companies", At Home's page about Home Box Office. On the Russell 3000
  texts this finds 266 Wikipedia pages (a sample of 25 read: all about something else) and 2 of
  2,868 Yahoo descriptions that say "We" or "the Company" instead (left out of their record's
  vectors; its other texts stay).

A text that merely names a competitor later on ("... competes with JPMorgan Chase") is not
flagged: only its subject, or a copy of the other's own text, counts.
"""
from __future__ import annotations

import re
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from . import records as rec

NEAR = 0.8  # word 4-shingle Jaccard at or above which two texts are one text re-scraped
SHINGLE = 4
MIN_KEY_CHARS = 3  # a name shorter than this names nobody on its own
MIN_SHARED_TOKENS = 8  # a shorter text held by several ("No Description Available") is a placeholder, no page
SHOWN = 3  # holders named in a "held verbatim" reason
NAME_FIELD = "name"  # the name field of a corpus whose index names no --collapse-field
NAMES_NOWHERE = "names its record nowhere, as its other texts do"
GENERIC_SUBJECTS = frozenset({"a", "an", "this", "these", "following"})  # "A bank holding company is ...": no one's name
MISATTRIBUTED = "misattributed-text"  # the rejection of a record whose every text is about another record

_SUFFIX = re.compile(r"(,?\s+(inc\.?|incorporated|corporation|corp\.?|company|co\.?|holdings?|group|plc|ltd\.?|"
                     r"limited|llc|l\.?p\.?|n\.?v\.?|s\.?a\.?|bancorp(oration)?|trust|the|& co))+$", re.I)
_TOKEN = re.compile(r"[^\W_]+|&")
# a text's first phrase ends at , ( ; : a verb "is"/"was"/"are"/"were", or a sentence end (not "U.S. B…")
_SUBJECT_END = re.compile(r"[,(;:]|(?<!\b[A-Za-z])\.(\s|$)|\s(is|was|are|were)\s", re.I)
_CLASS = re.compile(r"(\s+class\s+[a-z]|\s*-\s*[a-z])\s*$", re.I)
COMMON_MIN_TEXTS = 2  # texts writing a word in lower case that make it a common word (lower_case_words)
_LOWER_WORD = re.compile(r"(?<![\w./@])[a-z][a-z-]+\b(?!\.\w)")  # not a web address's "autozone.com"


def short_name(name: str) -> str:
    """The name without "The " and legal suffixes ("The Coca-Cola Company" → "Coca-Cola")."""
    out, previous = re.sub(r"^the\s+", "", name.strip(), flags=re.I), None
    while previous != out:
        previous, out = out, _SUFFIX.sub("", out).strip(" ,&.")
    return out


def tokens(text: str) -> tuple[str, ...]:
    """Lower-case word tokens, ``&`` one of them and a run of single letters one word ("V.F." and
    "VF" → "vf"): the unit every name and text is matched in."""
    out: list[str] = []
    glued = False
    for t in _TOKEN.findall(text.lower()):
        if len(t) == 1 and t != "&" and glued:
            out[-1] += t
        else:
            out.append(t)
            glued = len(t) == 1 and t != "&"
    return tuple(out)


def _plain_tokens(text: str) -> tuple[str, ...]:
    """:func:`tokens` of ``text`` with accents dropped and UTF-8 read as Latin-1 repaired ("EstÃ©e" →
    "estee"): how a text is searched for its own record's name, which scrapes spell every way."""
    if "Ã" in text:
        try:
            text = text.encode("cp1252").decode("utf-8")
        except UnicodeError:
            pass
    if not text.isascii():
        text = "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))
    return tokens(text)


def _within(toks: tuple[str, ...], key: tuple[str, ...]) -> bool:
    """Whether ``key`` occurs in ``toks`` as consecutive tokens."""
    n = len(key)
    return n > 0 and any(toks[i:i + n] == key for i in range(len(toks) - n + 1))


def _name_tokens(name: str) -> tuple[str, ...]:
    """A name's tokens, a parenthesis ("Equinix, Inc. (REIT)") and a leading "the" cut."""
    out = tokens(re.sub(r"\s*\([^)]*\)", "", name))
    return out[1:] if out[:1] == ("the",) else out


def issuer(name: str) -> tuple[str, ...]:
    """The issuer a name stands for: its tokens without a share class ("Alphabet Inc Class A",
    "Discovery Communications-C"). Records of one issuer share their texts freely."""
    return _name_tokens(_CLASS.sub("", name))


@dataclass(frozen=True)
class Flag:
    """Text ``field`` of row ``row`` (record ``id``) is about record ``about_id`` (named
    ``about_name``: the first record of that issuer; both None for a text that belongs to none of
    the records holding it), found by ``why``."""

    row: int
    id: str
    field: str
    about_name: str | None
    about_id: str | None
    why: str

    def reason(self) -> str:
        """``text_wikipedia: about JPMorgan Chase & Co. (JPM): its subject``."""
        if self.about_id is None:
            return f"{self.field}: {self.why}"
        return f"{self.field}: about {self.about_name} ({self.about_id}): {self.why}"


class _Names:
    """The corpus's names as token keys (each name in full and short), matched longest first. A
    one-word short name that the corpus's texts also use as a lower-case word ("First" of First
    Bancorp, "Target") is no key: it is too common to name anyone."""

    def __init__(self, names: Mapping[tuple[str, ...], str], common: set):
        claims: dict[tuple[str, ...], set] = defaultdict(set)
        for who, name in names.items():
            short = _name_tokens(short_name(re.sub(r"\s*\([^)]*\)", "", _CLASS.sub("", name))))
            for key in {who, short}:
                if sum(map(len, key)) >= MIN_KEY_CHARS and not (len(key) == 1 and key[0] in common):
                    claims[key].add(who)
        self.keys = {k: frozenset(v) for k, v in claims.items()}
        self.longest = max(map(len, self.keys), default=0)
        self.starts = {k[0] for k in self.keys}

    def match_at(self, toks: tuple[str, ...], i: int) -> tuple[str, ...] | None:
        """The longest key starting at token ``i``, or None."""
        if toks[i] not in self.starts:
            return None
        for n in range(min(self.longest, len(toks) - i), 0, -1):
            if toks[i:i + n] in self.keys:
                return toks[i:i + n]
        return None

    def mentioned(self, toks: tuple[str, ...]) -> set:
        """Issuers named anywhere in ``toks``, each mention matched at its longest (the "Chase" of
        "JPMorgan Chase" names JPMorgan Chase, not Chase Corporation)."""
        out, i = set(), 0
        while i < len(toks):
            key = self.match_at(toks, i)
            if key is None:
                i += 1
            else:
                out |= self.keys[key]
                i += len(key)
        return out

    def subject_of(self, text: str, own: tuple[str, ...]) -> tuple[str, ...] | None:
        """The issuer other than ``own`` that ``text``'s first phrase is about, or None.

        The phrase must start with the issuer's name (its longest key; one claimed by several
        names names nobody): "JPMorgan Chase Bank, N.A., doing business as ..." is about
        JPMorgan Chase & Co. A one-word short name must be the whole phrase, legal suffixes cut
        ("Hudson Yards is a neighborhood" is not about Hudson Ltd.). A phrase that starts with
        as much of ``own``'s name is ``own``'s ("Apple Hospitality REIT" is not about Apple)."""
        end = _SUBJECT_END.search(text)
        phrase = text[:end.start()] if end else text
        said = _name_tokens(text[:len(phrase) + 40])  # "AutoZone, Inc.": a name may run past the phrase
        key = self.match_at(said, 0) if said else None
        if key is None or own in self.keys[key] or len(self.keys[key]) > 1 or _common(said, own) >= len(key):
            return None
        if len(key) == 1 and _name_tokens(short_name(phrase)) != key:
            return None
        return next(iter(self.keys[key]))


def lower_case_words(texts: Iterable[str]) -> set[str]:
    """The words that at least COMMON_MIN_TEXTS of the distinct ``texts`` write in lower case (not a
    web address's "autozone.com"): a one-word name among them is too common to name anyone. One
    text's lower case is not enough: a flavour's "apple jack'd" or a quoted "intel" would make Apple
    and Intel unnameable."""
    uses = Counter(w for t in set(texts) for w in set(_LOWER_WORD.findall(t)))
    return {w for w, n in uses.items() if n >= COMMON_MIN_TEXTS}


def _common(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _shingles(toks: tuple[str, ...]) -> frozenset:
    return frozenset(toks[i:i + SHINGLE] for i in range(max(1, len(toks) - SHINGLE + 1)))


def misattributed(rows: Iterable[tuple[str, str | None, Mapping[str, str]]]) -> list[Flag]:
    """The texts of ``rows`` — (id, name, {field: text}) each, in corpus order — that are about
    another record of them, one :class:`Flag` per (row, field), in row and field order. A row
    without a name is never flagged, and names nobody."""
    corpus = _Corpus(list(rows))
    found = corpus.about_others()  # its subject: first, so that a copy never vouches for a text
    by_subject = set(found)
    for i, (_, _, texts) in enumerate(corpus.rows):
        for f in texts:
            if corpus.issuer_of[i] and (i, f) not in found:
                hit = corpus.copied(i, f, by_subject)
                if hit is not None:
                    found[(i, f)] = hit
    for i, (_, _, texts) in enumerate(corpus.rows):  # last: a text named by no rule above
        if corpus.issuer_of[i] and len(texts) > 1:
            found.update({(i, f): (None, NAMES_NOWHERE) for f in corpus.unnamed(i) if (i, f) not in found})
    return corpus.flags(found)


class _Corpus:
    """The rows :func:`misattributed` reads, indexed once: each row's issuer, the first and every row
    of each issuer, every text's tokens (keyed (row, field)), the issuers holding each token
    sequence, and — computed when first asked — whom each text mentions and its shingles."""

    def __init__(self, rows: list[tuple[str, str | None, Mapping[str, str]]]):
        self.rows = rows
        self.issuer_of = [issuer(name) if isinstance(name, str) else () for _, name, _ in rows]
        self.first: dict[tuple[str, ...], int] = {}
        self.rows_of: dict[tuple[str, ...], list[int]] = defaultdict(list)
        for i, who in enumerate(self.issuer_of):
            if who:
                self.first.setdefault(who, i)
                self.rows_of[who].append(i)
        self.common = lower_case_words(t for _, _, texts in rows for t in texts.values())
        self.names = _Names({who: rows[i][1] for who, i in self.first.items()}, self.common)
        self.toks = {(i, f): tokens(t) for i, (_, _, texts) in enumerate(rows) for f, t in texts.items()}
        self.holders: dict[tuple[str, ...], set] = defaultdict(set)
        for (i, _), t in self.toks.items():
            if self.issuer_of[i]:
                self.holders[t].add(self.issuer_of[i])
        self._mentions: dict[tuple[int, str], set] = {}
        self._shingles: dict[tuple[int, str], frozenset] = {}

    def about_others(self) -> dict[tuple[int, str], tuple[tuple[str, ...], str]]:
        """(row, field) → (the issuer, why) for each text whose subject is another issuer."""
        found = {}
        for i, (_, _, texts) in enumerate(self.rows):
            for f, text in texts.items():
                other = self.names.subject_of(text, self.issuer_of[i]) if self.issuer_of[i] else None
                if other is not None:
                    found[(i, f)] = other, "its subject"
        return found

    def mentioned(self, where: tuple[int, str]) -> set:
        if where not in self._mentions:
            self._mentions[where] = self.names.mentioned(self.toks[where])
        return self._mentions[where]

    def shingled(self, where: tuple[int, str]) -> frozenset:
        if where not in self._shingles:
            self._shingles[where] = _shingles(self.toks[where])
        return self._shingles[where]

    def copied(self, i: int, f: str, by_subject: set):
        """(the issuer, why) whose own text this one is a copy of, for a text naming others, not its
        own issuer; (None, why) for a text others hold verbatim; None: neither. ``by_subject``: the
        texts about another issuer, never one's own text."""
        own, t = self.issuer_of[i], self.toks[(i, f)]
        if own in self.mentioned((i, f)):
            return None
        for other in sorted(self.mentioned((i, f)) - {own}, key=lambda x: self.first[x]):
            for j in self.rows_of[other]:
                for g in self.rows[j][2]:
                    if (j, g) in by_subject or other not in self.mentioned((j, g)):
                        continue  # not the other's own text: a copy of it proves nothing
                    if self.toks[(j, g)] == t:
                        return other, f"identical to its {g}"
                    a, b = self.shingled((i, f)), self.shingled((j, g))
                    jaccard = len(a & b) / len(a | b)
                    if jaccard >= NEAR:
                        return other, f"near-identical to its {g} (Jaccard {jaccard:.2f})"
        others = sorted(self.holders[t] - {own}, key=lambda x: self.first[x])
        if others and len(t) >= MIN_SHARED_TOKENS:
            ids = [self.rows[self.first[x]][0] for x in others]
            shown = ", ".join(ids[:SHOWN]) + (", …" if len(ids) > SHOWN else "")
            return None, f"held verbatim by {len(ids)} other{'s' * (len(ids) > 1)} ({shown}), naming none of them"
        return None

    def names_own(self, i: int, toks: tuple[str, ...]) -> bool:
        """Whether ``toks`` (:func:`_plain_tokens`) name row ``i``'s record in any way a text about
        it does: its name in full or short, or glued ("NewAge" in "New Age Beverages"), its
        initials ("COPT", "GLPI"), the first word of its short name when 3 letters or more, or its id
        ("DHC is a REIT") unless the corpus writes that id as a lower-case word (At Home Group's
        HOME is a word of Home Box Office's page)."""
        name = re.sub(r"\s*\([^)]*\)", "", _CLASS.sub("", self.rows[i][1]))
        full, short = _name_tokens(name), _name_tokens(short_name(name))
        full, short = _plain_tokens(" ".join(full)), _plain_tokens(" ".join(short))
        said = set(toks)
        initials = "".join(w[0] for w in full if w not in ("and", "of", "&"))
        own_id = self.rows[i][0].lower()
        return (_within(toks, full) or _within(toks, short) or "".join(short) in "".join(toks)
                or initials in said or (len(short[0]) >= 3 and short[0] in said if short else False)
                or (own_id in said and own_id not in self.common))

    def unnamed(self, i: int) -> list[str]:
        """Row ``i``'s texts that name its record nowhere (:meth:`names_own`) while one of its others
        does, unless such a text's subject — its first phrase — is named by one of those others (a
        former name); a generic subject ("A bank holding company", "This is a list") excuses none."""
        toks = {f: _plain_tokens(t) for f, t in self.rows[i][2].items()}
        named = {f for f, t in toks.items() if self.names_own(i, t)}
        out = []
        for f in toks.keys() - named if named else ():
            text = self.rows[i][2][f]
            end = _SUBJECT_END.search(text)
            subject = _name_tokens(short_name(" ".join(_plain_tokens(text[:end.start()] if end else text))))
            if not subject or subject[0] in GENERIC_SUBJECTS or not any(_within(toks[g], subject) for g in named):
                out.append(f)
        return sorted(out, key=list(toks).index)

    def flags(self, found: dict[tuple[int, str], tuple]) -> list[Flag]:
        """One :class:`Flag` per text ``found``, in row and field order."""
        flags = []
        for i, (doc_id, _, texts) in enumerate(self.rows):
            for f in texts:
                if (i, f) in found:
                    other, why = found[(i, f)]
                    name, other_id = (self.rows[self.first[other]][1], self.rows[self.first[other]][0]) \
                        if other else (None, None)
                    flags.append(Flag(i, doc_id, f, name, other_id, why))
        return flags


def check_corpus(path: str, *, id_field: str = "id", text_field: str = "text", text_fields: tuple[str, ...] = (),
                 limits: rec.Limits = rec.DEFAULT_LIMITS, name_field: str | None = None) -> dict[int, list[Flag]]:
    """The flagged texts of corpus ``path`` (JSONL, parsed as ``relsearch index`` parses it: lines
    it would reject, and repeats of an id, take no part), by 1-based line number. ``name_field``:
    the metadata field that names a record (``relsearch index``: its ``--collapse-field``); None:
    ``name``. A corpus whose records have no such field gets no flags."""
    names = tuple(text_fields) if len(text_fields) > 1 else (text_field,)
    rows, lines, seen = [], [], set()
    for n, raw in rec.read_numbered_lines(path, max_bytes=limits.max_line_bytes):
        r = rec.parse_line(n, raw, id_field=id_field, text_field=text_field, limits=limits, text_fields=text_fields)
        if isinstance(r, rec.Record) and r.id not in seen:
            seen.add(r.id)
            texts = r.texts if len(names) > 1 else {text_field: r.text}
            rows.append((r.id, r.metadata.get(name_field or NAME_FIELD), texts))
            lines.append(n)
    if not any(isinstance(name, str) and name.strip() for _, name, _ in rows):
        return {}
    out: dict[int, list[Flag]] = defaultdict(list)
    for flag in misattributed(rows):
        out[lines[flag.row]].append(flag)
    return dict(out)


def parse_line(line_no: int, raw: bytes, flags: list[Flag] | None = None, **parse) -> rec.Record | rec.Rejection:
    """:func:`records.parse_line` of the line with its ``flags``' texts set to null: the record
    is indexed by its other texts, or, when it has none left, rejected as :data:`MISATTRIBUTED`
    with the flags' reasons."""
    if not flags:
        return rec.parse_line(line_no, raw, **parse)
    obj = rec.decode_line(line_no, raw, parse.get("limits", rec.DEFAULT_LIMITS))
    kept = rec.json_text({**obj, **{f.field: None for f in flags}}).encode("utf-8")
    r = rec.parse_line(line_no, kept, **parse)
    if isinstance(r, rec.Rejection) and r.reason in (rec.NO_TEXT, rec.NULL_TEXT):
        return rec.Rejection(line_no, MISATTRIBUTED, "; ".join(f.reason() for f in flags), r.raw)
    return r
