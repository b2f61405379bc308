"""An index generation's ``manifest.json`` as one typed, frozen record, parsed and written only here.

Readers take attributes (``manifest.dim``, ``manifest.counts.documents``, ``manifest.fields.metadata``);
writers build a new record with :meth:`Manifest.replace` and hand it to ``store.commit``, the one
place that stamps format, version, time and file checksums and writes it (:func:`write`).

The open-ended sections — ``encoder`` (the encoder's identity and, as ``precision``, the dtype the
index is encoded and queried in: :attr:`Manifest.precision`), ``bundle``, ``faiss`` (spec,
tuning), ``input``, ``backends``, ``projections``, ``files``, ``runs`` — stay JSON objects: they
are recorded and compared whole, and their keys grow with features. Treat them as read-only.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..version import __version__
from ..files import replaced_atomically
from .integrity import IndexCorruptError, open_regular
from .segments import SegmentSpec

FORMAT = "relsearch-index/1"
FILE = "manifest.json"
NO_BUNDLE = {"path": None, "fingerprint": None, "operators": []}
# The encoder dtype an index is built and queried in (``encoder.precision``), decided once at build.
ENCODER_PRECISIONS = ("fp32", "bf16", "fp16")
# A manifest written before the build recorded it: fp32, what `auto` chose on every CPU without bf16
# instructions and with every explicit --precision fp32, and the exact dtype the 16-bit ones approximate
# (a GPU build of that time ran fp16, an AMX one maybe bf16: their queries now run fp32, within bf16's
# rounding of the old answers, and the same in every process).
LEGACY_PRECISION = "fp32"


@dataclass(frozen=True)
class Counts:
    documents: int  # live documents
    positions: int  # rows of the vectors (live and deleted)
    deleted: int = 0  # dead positions
    tombstones: int = 0  # dead positions still held by a FAISS index (excluded by a selector)


@dataclass(frozen=True)
class Fields:
    id: str = "id"
    text: str = "text"
    metadata: tuple[str, ...] = ()  # metadata fields seen in the documents, sorted
    # two or more named text fields, in order (indexer/text_fields.py; texts[0] == text); () for one
    texts: tuple[str, ...] = ()


@dataclass(frozen=True)
class Manifest:
    encoder: dict[str, Any]  # the identity of the encoder that wrote the vectors (Encoder.identity)
    dim: int
    counts: Counts
    fields: Fields
    faiss: dict[str, Any]
    bundle: dict[str, Any] = field(default_factory=lambda: dict(NO_BUNDLE))
    runs: tuple[dict, ...] = ()  # the latest writes, oldest first
    input: dict | None = None  # path and sha256 of the build's input
    segments: tuple[SegmentSpec, ...] | None = None  # None: one segment with the classic file names
    max_segments: int | None = None
    projections: dict[str, Any] = field(default_factory=dict)
    backends: dict[str, Any] = field(default_factory=dict)
    field_faiss: dict[str, Any] = field(default_factory=dict)  # text field 1… name → its faiss section
    # a metadata field whose equal values are one issuer (share classes): queries collapse on it by default
    collapse: str | None = None
    files: dict[str, dict] = field(default_factory=dict)  # name → {"size", "sha256"}, stamped by store.commit
    format: str = FORMAT
    version: str = __version__
    created_at: str = ""

    @property
    def precision(self) -> str:
        """The encoder dtype of the index's vectors, which its query encoders use too (``encoder.precision``:
        fp32 / bf16 / fp16, recorded at build; :data:`LEGACY_PRECISION` for a manifest from before)."""
        return self.encoder.get("precision", LEGACY_PRECISION)

    @property
    def segment_specs(self) -> list[SegmentSpec]:
        if self.segments is None:
            return [SegmentSpec("", 0, self.counts.positions)]
        return list(self.segments)

    @property
    def projection_files(self) -> list:
        return [entry.get("file") for entry in self.projections.values() if isinstance(entry, dict)]

    def replace(self, **changes) -> "Manifest":
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict:
        out = {"format": self.format, "version": self.version, "created_at": self.created_at,
               "encoder": self.encoder, "bundle": self.bundle, "counts": dataclasses.asdict(self.counts),
               "runs": list(self.runs), "faiss": self.faiss,
               "fields": {"id": self.fields.id, "text": self.fields.text, "metadata": list(self.fields.metadata),
                          **({"texts": list(self.fields.texts)} if self.fields.texts else {})},
               "dim": self.dim, "backends": self.backends}
        optional = {"input": self.input, "projections": self.projections or None, "max_segments": self.max_segments,
                    "field_faiss": self.field_faiss or None, "collapse": self.collapse,
                    "segments": None if self.segments is None else [s.as_json() for s in self.segments]}
        out.update({k: v for k, v in optional.items() if v is not None})
        out["files"] = self.files
        return out

    @classmethod
    def from_json(cls, data: Any, path: Path | str = FILE) -> "Manifest":
        """Check types by name (a field edited by hand into another type is refused here, not as an
        AttributeError deep in a query) and build the record."""
        if not isinstance(data, dict):
            raise IndexCorruptError(f"{path} is not a JSON object; the index is damaged")
        if data.get("format") != FORMAT:
            raise ValueError(f"{path}: unsupported index format {data.get('format')!r} (expected {FORMAT})")
        for name in REQUIRED:
            if name not in data:
                raise IndexCorruptError(f"{path} has no {name!r} field; the index is damaged")
        for name, kind in {**REQUIRED, **OPTIONAL}.items():
            if name in data:
                _check_type(path, name, data[name], kind)
        for (outer, inner), kind in NESTED.items():
            _check_type(path, f"{outer}.{inner}", data[outer].get(inner), kind)
        precision = data["encoder"].get("precision", LEGACY_PRECISION)
        if precision not in ENCODER_PRECISIONS:
            raise IndexCorruptError(f"{path}: 'encoder.precision' is {precision!r:.60}, not one of "
                                    f"{', '.join(ENCODER_PRECISIONS)}; the index is damaged")
        for key, value in data["counts"].items():
            _check_type(path, f"counts.{key}", value, int)
        try:
            counts = Counts(**data["counts"])
            segments = None if "segments" not in data else tuple(
                SegmentSpec(s["prefix"], int(s["start"]), int(s["positions"])) for s in data["segments"])
        except (KeyError, TypeError, ValueError) as e:
            raise IndexCorruptError(f"{path}: malformed counts or segments ({e.__class__.__name__}); "
                                    "the index is damaged") from None
        f = data["fields"]
        texts = f.get("texts", [])
        if not (isinstance(texts, list) and all(isinstance(t, str) and t for t in texts)
                and (not texts or (len(texts) > 1 and texts[0] == f["text"] and len(set(texts)) == len(texts)))):
            raise IndexCorruptError(f"{path}: 'fields.texts' is {texts!r:.80}, not two or more distinct names "
                                    "starting with fields.text; the index is damaged")
        return cls(encoder=data["encoder"], dim=data["dim"], counts=counts,
                   fields=Fields(f["id"], f["text"], tuple(f["metadata"]), tuple(texts)), faiss=data["faiss"],
                   bundle=data.get("bundle", dict(NO_BUNDLE)), runs=tuple(data.get("runs", ())),
                   input=data.get("input"), segments=segments, max_segments=data.get("max_segments"),
                   projections=data.get("projections", {}), backends=data.get("backends", {}),
                   field_faiss=data.get("field_faiss", {}), collapse=data.get("collapse"),
                   files=data["files"], format=data["format"], version=data.get("version", ""),
                   created_at=data.get("created_at", ""))


REQUIRED = {"format": str, "encoder": dict, "dim": int, "counts": dict, "fields": dict, "faiss": dict, "files": dict}
OPTIONAL = {"bundle": dict, "projections": dict, "runs": list, "input": dict, "backends": dict, "segments": list,
            "max_segments": int, "field_faiss": dict, "collapse": str}
NESTED = {("encoder", "model"): str, ("fields", "id"): str, ("fields", "text"): str, ("fields", "metadata"): list}
_JSON_KIND = {str: "string", dict: "object", int: "integer", list: "array"}


def _check_type(path, name: str, value, kind: type) -> None:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise IndexCorruptError(f"{path}: {name!r} is {value!r:.60}, not a JSON {_JSON_KIND[kind]}; "
                                "the index is damaged")


def parse(data: bytes, path: Path | str = FILE) -> Manifest:
    try:
        raw = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise IndexCorruptError(f"{path} is not valid JSON ({e.__class__.__name__}); the index is damaged") from None
    return Manifest.from_json(raw, path)


def read(gen: str | os.PathLike) -> Manifest:
    """The manifest of generation ``gen``; a damaged one (or a symlink) is an IndexCorruptError naming it."""
    path = Path(gen) / FILE
    with os.fdopen(open_regular(path), "rb") as f:
        return parse(f.read(), path)


def write(gen: Path, manifest: Manifest) -> None:
    """Write ``gen``'s manifest under a temporary name, fsync it and rename it: never half-written,
    and on disk once this returns (the rename included)."""
    with replaced_atomically(Path(gen) / FILE) as tmp:
        tmp.write_text(json.dumps(manifest.to_json(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
    fd = os.open(gen, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
