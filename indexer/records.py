"""Parse and validate corpus lines: each line becomes a Record or a Rejection with a reason."""
from __future__ import annotations

import json
from dataclasses import dataclass, field

# Rejection reasons, stable strings (they appear in rejected.jsonl and in tests).
UNDECODABLE = "undecodable-bytes"
INVALID_JSON = "invalid-json"
NOT_OBJECT = "not-an-object"
MISSING_ID = "missing-id"
EMPTY_ID = "empty-id"
MISSING_TEXT = "missing-text"
EMPTY_TEXT = "empty-text"
NON_STRING_TEXT = "non-string-text"
DUPLICATE_ID = "duplicate-id"
EMPTY_LINE = "empty-line"


@dataclass(frozen=True)
class Record:
    line: int  # 1-based line number in the input
    id: str
    text: str
    metadata: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Rejection:
    line: int
    reason: str
    detail: str = ""
    raw: str = ""  # the line as text (undecodable bytes replaced), truncated

    def to_json(self) -> dict:
        return {"line": self.line, "reason": self.reason, "detail": self.detail, "raw": self.raw}


def parse_line(line_no: int, raw: bytes, *, id_field: str = "id", text_field: str = "text") -> Record | Rejection:
    """One input line (bytes, without newline) → Record or Rejection."""
    preview = raw[:500].decode("utf-8", errors="replace")
    if not raw.strip():
        return Rejection(line_no, EMPTY_LINE, "blank line")
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return Rejection(line_no, UNDECODABLE, f"not UTF-8 at byte {e.start}", preview)
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        return Rejection(line_no, INVALID_JSON, str(e), preview)
    if not isinstance(obj, dict):
        return Rejection(line_no, NOT_OBJECT, f"got {type(obj).__name__}", preview)
    if id_field not in obj or obj[id_field] is None:
        return Rejection(line_no, MISSING_ID, f"no {id_field!r} field", preview)
    doc_id = obj[id_field]
    if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)):
        return Rejection(line_no, EMPTY_ID, f"{id_field!r} must be a string or integer", preview)
    doc_id = str(doc_id).strip()
    if not doc_id:
        return Rejection(line_no, EMPTY_ID, f"{id_field!r} is empty", preview)
    if text_field not in obj or obj[text_field] is None:
        return Rejection(line_no, MISSING_TEXT, f"no {text_field!r} field", preview)
    text = obj[text_field]
    if not isinstance(text, str):
        return Rejection(line_no, NON_STRING_TEXT, f"{text_field!r} is {type(text).__name__}", preview)
    if not text.strip():
        return Rejection(line_no, EMPTY_TEXT, f"{text_field!r} is empty", preview)
    metadata = {k: v for k, v in obj.items() if k not in (id_field, text_field)}
    return Record(line_no, doc_id, text, metadata)
