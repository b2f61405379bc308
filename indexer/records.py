"""Parse and validate corpus lines: each line becomes a Record or a Rejection with a reason.

Input comes from people and programs we do not control, so nothing here may raise: every way a
line can be wrong maps to one stable reason string. Size limits (:class:`Limits`) bound what one
line can cost in memory, in the docstore and in the hits a query returns; the defaults are
documented in docs/guarantees.md and set with ``relsearch index --max-line-bytes`` etc.
"""
from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

# Rejection reasons, stable strings (they appear in rejected.jsonl and in tests).
UNDECODABLE = "undecodable-bytes"
INVALID_JSON = "invalid-json"
NOT_OBJECT = "not-an-object"
MISSING_ID = "missing-id"
EMPTY_ID = "empty-id"
NON_STRING_ID = "non-string-id"  # a float, boolean, list or object where the id belongs
MISSING_TEXT = "missing-text"
NULL_TEXT = "null-text"  # the text field is there, holding JSON null
EMPTY_TEXT = "empty-text"
NON_STRING_TEXT = "non-string-text"
DUPLICATE_ID = "duplicate-id"
EMPTY_LINE = "empty-line"
LINE_TOO_LONG = "line-too-long"
TEXT_TOO_LONG = "text-too-long"
METADATA_TOO_LARGE = "metadata-too-large"
INVALID_UNICODE = "invalid-unicode"  # valid UTF-8 bytes, but JSON escapes of lone surrogates (\ud800)
NO_TEXT = "no-text"  # several named text fields (--text-field A --text-field B), none of them holding a text

MiB = 1 << 20
BOM = b"\xef\xbb\xbf"
MAX_METADATA_DEPTH = 64  # nesting of metadata values; SQLite's JSON functions stop at 1000
PREVIEW_BYTES = 500


@dataclass(frozen=True)
class Limits:
    """Per-line size limits, in bytes of UTF-8.

    ``max_line_bytes``: longer lines are rejected unparsed (and never held whole in memory);
    ``max_text_bytes``: longer texts are rejected (texts merely longer than the model's window are
    truncated by the encoder and counted, not rejected); ``max_metadata_bytes``: the other fields,
    serialised as JSON.
    """

    max_line_bytes: int = 32 * MiB
    max_text_bytes: int = 8 * MiB
    max_metadata_bytes: int = 1 * MiB

    def __post_init__(self):
        for name in ("max_line_bytes", "max_text_bytes", "max_metadata_bytes"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class Record:
    line: int  # 1-based line number in the input
    id: str
    text: str  # the text field's; with several named text fields, the first of them the line has
    metadata: dict = field(default_factory=dict)
    # several named text fields (indexer/text_fields.py): name → text, for those the line has, in
    # the order named; empty for an index of one text field
    texts: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Rejection:
    line: int
    reason: str
    detail: str = ""
    raw: str = ""  # the line as text (undecodable bytes replaced), truncated

    def to_json(self) -> dict:
        return {"line": self.line, "reason": self.reason, "detail": self.detail, "raw": self.raw}


def read_numbered_lines(path: str, start: int = 0, end: int | None = None, first_line: int = 1,
                        max_bytes: int | None = None, *, opener=open):
    """Yield (line_number, raw bytes without the newline) for the lines in bytes [start, end).

    A line longer than ``max_bytes`` (default: ``DEFAULT_LIMITS.max_line_bytes``) is yielded as
    its first ``max_bytes + 2`` bytes and the rest is skipped without holding it in memory, so a
    hostile multi-gigabyte line costs no more than the limit; parse_line rejects it by its length.
    ``opener(path, "rb")`` gives a binary file (the pipelines pass Beam's FileSystems), seekable
    unless ``start`` is 0.
    """
    limit = DEFAULT_LIMITS.max_line_bytes if max_bytes is None else max_bytes
    with opener(path, "rb") as f:
        if start:  # only then: a pipe (`--ids <(...)`, /dev/fd/N) reads from its start but cannot seek
            f.seek(start)
        number, pos = first_line, start
        while end is None or pos < end:
            line = f.readline(limit + 2)  # + 2: a line of exactly ``limit`` bytes may end in \r\n
            if not line:
                return
            pos += len(line)
            if len(line) == limit + 2 and not line.endswith(b"\n"):
                pos += _skip_rest_of_line(f)
                yield number, line  # over the limit: rejected as line-too-long
            else:
                yield number, line.rstrip(b"\r\n")
            number += 1


def _skip_rest_of_line(f, piece: int = 1 << 20) -> int:
    skipped = 0
    while part := f.readline(piece):
        skipped += len(part)
        if part.endswith(b"\n"):
            break
    return skipped


class _BadNumber(ValueError):
    pass


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # 1e999: valid JSON grammar, but no float holds it
        raise _BadNumber(f"number {text[:40]} is out of range")
    return value


def _no_constant(name: str):
    raise _BadNumber(f"{name} is not valid JSON")  # json accepts NaN/Infinity; SQLite and ES do not


_STRICT_JSON = json.JSONDecoder(parse_float=_finite_float, parse_constant=_no_constant)  # one, not one per line
# a record's JSON as the index writes it, UTF-8 kept: one encoder for every row, where
# json.dumps(ensure_ascii=False) builds one per call
json_text = json.JSONEncoder(ensure_ascii=False).encode


def _preview(raw: bytes) -> str:
    return raw[:PREVIEW_BYTES].decode("utf-8", errors="replace")


def decode_line(line_no: int, raw: bytes, limits: Limits = DEFAULT_LIMITS) -> dict | Rejection:
    """One input line (bytes, without newline) → its JSON object, or a Rejection.

    A leading UTF-8 byte-order mark is ignored (editors on Windows write one; concatenated files
    carry it mid-file). Strict JSON: NaN, Infinity and numbers out of float range are refused.
    """
    if len(raw) > limits.max_line_bytes:
        return Rejection(line_no, LINE_TOO_LONG, f"line has more than {limits.max_line_bytes} bytes "
                         "(--max-line-bytes)", _preview(raw))
    raw = raw[len(BOM):] if raw.startswith(BOM) else raw
    if not raw.strip():
        return Rejection(line_no, EMPTY_LINE, "blank line")
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return Rejection(line_no, UNDECODABLE, f"not UTF-8 at byte {e.start}", _preview(raw))
    try:
        obj = _STRICT_JSON.decode(line)
    except json.JSONDecodeError as e:
        return Rejection(line_no, INVALID_JSON, str(e), _preview(raw))
    except RecursionError:
        return Rejection(line_no, INVALID_JSON, "nested too deeply", _preview(raw))
    except ValueError as e:  # _BadNumber, or an integer over Python's 4300-digit limit
        return Rejection(line_no, INVALID_JSON, str(e)[:200], _preview(raw))
    if not isinstance(obj, dict):
        return Rejection(line_no, NOT_OBJECT, f"got {type(obj).__name__}", _preview(raw))
    return obj


def _depth(value, limit: int) -> int:
    """Nesting depth of a JSON value, counting no further than ``limit + 1``."""
    stack, deepest = [(value, 1)], 0
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d)
            if d > limit:
                return d
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def _utf8_size(s: str) -> int | None:
    """UTF-8 size of ``s``, None when it holds lone surrogates (they cannot be written out)."""
    try:
        return len(s.encode("utf-8"))
    except UnicodeEncodeError:
        return None


def parse_line(line_no: int, raw: bytes, *, id_field: str = "id", text_field: str = "text",
               limits: Limits = DEFAULT_LIMITS, text_fields: tuple[str, ...] = ()) -> Record | Rejection:
    """One input line (bytes, without newline) → Record or Rejection; never raises.

    ``text_fields``: two or more named text fields (indexer/text_fields.py); then ``text_field``
    is ignored and a line is a Record when at least one of them holds a text."""
    obj = decode_line(line_no, raw, limits)
    if isinstance(obj, Rejection):
        return obj
    if len(text_fields) > 1:
        checked = _named_texts_record(line_no, obj, id_field, tuple(text_fields), limits)
    else:
        checked = _record(line_no, obj, id_field, text_field, limits)
    return checked if isinstance(checked, Record) else Rejection(line_no, *checked, _preview(raw))


def _named_texts_record(line_no: int, obj: dict, id_field: str, names: tuple[str, ...],
                        limits: Limits) -> Record | tuple[str, str]:
    """A line of several named texts: each named field absent, null or blank is a text the document
    lacks; one holding something else than a string (or a text too long) rejects the line, as the
    one text field would. The first text present is the Record's ``text`` (the docstore's), the
    first named field is not metadata (as the one text field is not), the others stay metadata:
    a hit on them shows that text (retrieval/fields.py)."""
    texts = {}
    for name in names:
        value = obj.get(name)
        if value is None or (isinstance(value, str) and not value.strip()):
            continue
        checked = _record(line_no, {id_field: obj.get(id_field), name: value}, id_field, name, limits)
        if not isinstance(checked, Record):
            return checked
        texts[name] = value
    if not texts:
        if id_field not in obj or obj[id_field] is None:
            return MISSING_ID, f"no {id_field!r} field"
        return NO_TEXT, f"no text in any of {', '.join(names)}"
    first = next(iter(texts.values()))
    checked = _record(line_no, {**obj, names[0]: first}, id_field, names[0], limits)
    if not isinstance(checked, Record):
        return checked
    return Record(line_no, checked.id, first, checked.metadata, texts)


def _record(line_no: int, obj: dict, id_field: str, text_field: str, limits: Limits) -> Record | tuple[str, str]:
    """The Record of a decoded line, or the (reason, detail) of its rejection."""
    if id_field not in obj or obj[id_field] is None:
        return MISSING_ID, f"no {id_field!r} field"
    doc_id = obj[id_field]
    if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)):
        return NON_STRING_ID, f"{id_field!r} must be a string or integer, got {type(doc_id).__name__}"
    doc_id = str(doc_id).strip()
    if not doc_id:
        return EMPTY_ID, f"{id_field!r} is empty"
    if _utf8_size(doc_id) is None:
        return INVALID_UNICODE, f"{id_field!r} holds a lone surrogate escape"
    if text_field not in obj:
        return MISSING_TEXT, f"no {text_field!r} field"
    if obj[text_field] is None:
        return NULL_TEXT, f"{text_field!r} is null"
    text = obj[text_field]
    if not isinstance(text, str):
        return NON_STRING_TEXT, f"{text_field!r} is {type(text).__name__}"
    if not text.strip():
        return EMPTY_TEXT, f"{text_field!r} is empty"
    size = _utf8_size(text)
    if size is None:
        return INVALID_UNICODE, f"{text_field!r} holds a lone surrogate escape"
    if size > limits.max_text_bytes:
        return TEXT_TOO_LONG, f"{text_field!r} has {size} bytes, more than {limits.max_text_bytes} (--max-text-bytes)"
    metadata = {k: v for k, v in obj.items() if k not in (id_field, text_field)}
    if metadata:  # most corpora have none: nothing to measure
        if _depth(metadata, MAX_METADATA_DEPTH) > MAX_METADATA_DEPTH:
            return METADATA_TOO_LARGE, f"metadata nested deeper than {MAX_METADATA_DEPTH} levels"
        try:
            meta_size = len(json_text(metadata).encode("utf-8"))
        except UnicodeEncodeError:
            return INVALID_UNICODE, "metadata holds a lone surrogate escape"
        if meta_size > limits.max_metadata_bytes:
            return METADATA_TOO_LARGE, (f"metadata has {meta_size} bytes as JSON, more than "
                                        f"{limits.max_metadata_bytes} (--max-metadata-bytes)")
    return Record(line_no, doc_id, text, metadata)


def missing_field_hint(path: str, reasons: Mapping[str, int], *, id_field: str = "id", text_field: str = "text",
                       sample_lines: int = 100) -> str:
    """For an input of which no line was indexed: when every rejection (blank lines aside) is
    missing-id or every one is missing-text — a wrong ``--id-field`` / ``--text-field`` — a phrase
    naming that field and the fields the first ``sample_lines`` lines do have; else ''."""
    reasons = {r for r, n in reasons.items() if n and r != EMPTY_LINE}
    missing = {frozenset([MISSING_ID]): id_field, frozenset([MISSING_TEXT]): text_field}.get(frozenset(reasons))
    if missing is None:
        return ""
    seen: dict[str, None] = {}
    for n, raw in read_numbered_lines(path):
        obj = decode_line(n, raw)
        if isinstance(obj, dict):
            seen.update(dict.fromkeys(obj))
        if n >= sample_lines:
            break
    names = list(seen)
    listed = ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "")
    return f"no line has field {missing!r}; fields seen: {listed or '(none)'}"
