"""Model bundle on disk: encoder reference + named relation operators.

Layout of a bundle folder::

    bundle.json            manifest: format, encoder identity, operators (name, kind, description,
                           training data, metrics) — names are explicit, order never matters
    operators.safetensors  tensors named "<operator>/<param>"; re-ranking heads (encoder/heads.py)
                           as "head:<name>/<param>", described under the manifest's "heads"; the
                           LoRA deltas of query towers (kind ``encoder``, encoder/tower.py) once per
                           tower as "tower:<name>/<module>.lora_A|B", named by each operator's "tower"
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import math
import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

from ..files import check_regular_file, inside, read_regular_file
from .heads import TENSOR_PREFIX as HEAD_PREFIX, PairHead
from .model import POOLINGS, DEFAULT_MODEL, EncoderConfig, _local_or_hub_folder, _read_st_folder, resolve_model_path
from .relations import IDENTITY, KINDS, Operator
from .tower import marker_parts

FORMAT = "relsearch-bundle/1"
MANIFEST = "bundle.json"
TENSORS = "operators.safetensors"

log = logging.getLogger(__name__)
log.setLevel(logging.WARNING)  # said even where the CLI quiets the root logger (stderr when nothing is set up)


@dataclass(kw_only=True)
class Bundle:
    """Encoder reference (``encoder``: model, pooling, max_length, dim) + operators by name."""

    encoder: dict
    operators: dict[str, Operator] = field(default_factory=dict)
    path: str | None = None
    info: dict = field(default_factory=dict)
    heads: dict[str, PairHead] = field(default_factory=dict)  # re-rankers by name (encoder/heads.py)

    def __post_init__(self):
        self.operators.setdefault("identity", IDENTITY)
        dim = self.encoder.get("dim")
        for head in self.heads.values():
            if dim is not None and head.dim != dim:
                raise ValueError(f"head {head.name!r} has dimension {head.dim}, encoder has {dim}")
        for op in self.operators.values():
            if dim is not None and op.dim is not None and op.dim != dim:
                raise ValueError(f"operator {op.name!r} has dimension {op.dim}, encoder has {dim}")

    @property
    def ref(self) -> str:
        """What :func:`load_bundle` takes to load this bundle again (an index records it): the
        bundle folder, else the plain model's folder (absolute) or id."""
        ref = self.path or self.encoder["model"]
        return os.path.abspath(ref) if os.path.isdir(ref) else ref

    def encoder_config(self, **overrides) -> EncoderConfig:
        """How to build this bundle's encoder: model, pooling and max_length as recorded, then
        ``overrides`` (device, precision, threads, ...; a None override keeps the recorded value)."""
        recorded = {"model": self.encoder["model"], "pooling": self.encoder.get("pooling"),
                    "max_length": self.encoder.get("max_length")}
        return EncoderConfig(**{**recorded, **{k: v for k, v in overrides.items() if v is not None}})

    @property
    def fingerprint(self) -> str:
        digest = hashlib.sha256(json.dumps(self.encoder, sort_keys=True).encode())
        for name in sorted(self.operators):
            digest.update(name.encode())
            for key in sorted(self.operators[name].params):
                digest.update(np.ascontiguousarray(self.operators[name].params[key]).tobytes())
        for name in sorted(self.heads):  # none: the same fingerprint as before heads existed
            for key, value in sorted(self.heads[name].tensors().items()):
                digest.update(key.encode() + value.tobytes())
        return digest.hexdigest()[:16]

    def save(self, path: str | os.PathLike) -> Path:
        from safetensors.numpy import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        tensors: dict[str, np.ndarray] = {}
        for op in self.operators.values():
            for k, v in op.params.items():
                key, value = f"{_tensor_prefix(op)}/{k}", np.ascontiguousarray(v, dtype=np.float32)
                if key in tensors and not np.array_equal(tensors[key], value):  # one tower name, two towers
                    raise ValueError(f"operators share tower tensor {key!r} with different values")
                tensors[key] = value
        for head in self.heads.values():
            tensors.update(head.tensors())
        manifest = {
            "format": FORMAT,
            "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "encoder": self.encoder,
            "info": self.info,
            "operators": [
                {"name": op.name, "kind": op.kind, "description": op.description, **op.info}
                for op in sorted(self.operators.values(), key=lambda o: o.name)
            ],
        }
        if self.heads:
            manifest["heads"] = [self.heads[name].manifest_entry() for name in sorted(self.heads)]
        save_file(tensors, str(path / TENSORS))
        (path / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        self.path = str(path)
        return path


TOWER_PREFIX = "tower:"


def _tensor_prefix(op: Operator) -> str:
    """Where an operator's tensors live: its name, or its tower's (shared by the operators trained with it)."""
    return TOWER_PREFIX + op.info["tower"]["name"] if op.needs_text else op.name  # a query tower reads text


# What a bundle may hold: bundle.json is read whole, operators.safetensors is loaded whole.
MAX_MANIFEST_BYTES = 16 << 20
MAX_TENSORS_BYTES = 4 << 30
MAX_NAME_CHARS = 200


def _load_tensors(path: Path) -> dict[str, np.ndarray]:
    """The tensors of a bundle's operators.safetensors: a regular file of bounded size, never
    unpickled, every tensor floating point and finite (a NaN weight would rank nothing)."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    check_regular_file(path, limit=MAX_TENSORS_BYTES)
    try:
        tensors = load_file(str(path))
    except SafetensorError as e:  # e.g. a pickle put in its place: it is never unpickled
        raise ValueError(f"{path} is not a safetensors file ({e}); refusing to load") from None
    for key, value in tensors.items():
        if not np.issubdtype(value.dtype, np.floating):
            raise ValueError(f"{path}: tensor {key!r} is {value.dtype}, not floating point")
        if not np.isfinite(value).all():
            raise ValueError(f"{path}: tensor {key!r} holds NaN or infinite values")
    return tensors


def _check_manifest(manifest: dict, where: Path) -> None:
    """ValueError naming ``where`` (bundle.json) and the field, for any value load_bundle would
    misread: every field it uses has its type, names are unique, a tower's marker is a plain template."""
    def fail(field: str, expected: str, value=None) -> None:
        shown = repr(value) if value is None or isinstance(value, (bool, int, float)) else type(value).__name__
        raise ValueError(f"{where}: {field} must be {expected}, got {shown}")

    def text(value, field: str, *, optional: bool = False, name: bool = False) -> None:
        if optional and value is None:
            return
        if not isinstance(value, str) or (name and not 0 < len(value) <= MAX_NAME_CHARS):
            fail(field, f"a non-empty string of at most {MAX_NAME_CHARS} characters" if name else "a string", value)

    def mapping(value, field: str, *, optional: bool = False) -> None:
        if not (isinstance(value, dict) or (optional and value is None)):
            fail(field, "an object", value)

    def positive(value, field: str) -> None:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            fail(field, "a positive integer", value)

    encoder = manifest.get("encoder")
    mapping(encoder, "encoder")
    text(encoder.get("model"), "encoder.model", name=True)
    text(encoder.get("path"), "encoder.path", optional=True)
    if encoder.get("pooling") is not None and encoder["pooling"] not in POOLINGS:
        fail("encoder.pooling", " or ".join(POOLINGS), encoder["pooling"])
    positive(encoder.get("dim"), "encoder.dim")
    positive(encoder.get("max_length"), "encoder.max_length")
    mapping(manifest.get("info"), "info", optional=True)
    for key, required in (("operators", True), ("heads", False)):
        entries = manifest.get(key)
        if not isinstance(entries, list) and (required or entries is not None):
            fail(key, "a list of objects", entries)
        names = set()
        for i, entry in enumerate(entries or []):
            field = f"{key}[{i}]"
            mapping(entry, field)
            text(entry.get("name"), f"{field}.name", name=True)
            if entry["name"] in names:
                raise ValueError(f"{where}: {field}.name {entry['name']!r} is given twice")
            names.add(entry["name"])
            for sub in ("info", "recipe"):  # when given: of their type (description, metrics: _described)
                if sub in entry:
                    mapping(entry[sub], f"{field}.{sub}")
            if key == "operators":
                if entry.get("kind") not in KINDS:
                    fail(f"{field}.kind", "one of " + ", ".join(KINDS), entry.get("kind"))
                if entry["kind"] == "encoder":
                    _check_tower(entry.get("tower"), f"{where}: {field}.tower")
            else:
                text(entry.get("kind"), f"{field}.kind", optional=True)
                labels = entry.get("labels")
                if not (isinstance(labels, list) and labels and all(isinstance(x, str) for x in labels)):
                    fail(f"{field}.labels", "a non-empty list of strings", labels)
                text(entry.get("positive"), f"{field}.positive")


# What describes an operator or head and nothing else reads: its description, its test ``metrics`` (a head's
# under ``info``), an operator's ``whole_corpus`` (recipe fitting) and ``transfer`` (bench transfer). The explorer page, ``relsearch
# relations`` and model cards show them; no search uses them. One of the wrong type, a NaN or infinite
# number (JSON cannot carry it: GET /relations failed), or nesting deeper than MAX_DESCRIBED_DEPTH is
# dropped at load with one warning naming the file, the relation and the field: refusing the bundle
# would make every index built with it unsearchable over a figure that is only shown.
METRIC_TEXTS = ("metric", "split", "protocol")
METRIC_NUMBERS = ("queries", "candidates", "pairs", "accuracy", "macro_f1")
SCORE_TABLES = ("trained", "identity", "bm25", "hybrid")  # {metric name: number}
CORPUS_SPLITS = ("dev", "test")
CORPUS_NUMBERS = ("recipe", "operator", "identity", "bm25", "hybrid", "queries", "candidates")
# an operator's ``transfer``: its figure on a second dataset (relsearch bench transfer, bench/transfer.py)
TRANSFER_TEXTS = ("dataset", "folder", "metric", "protocol", "date", "commit", "command")
TRANSFER_NUMBERS = ("relation", "identity", "bm25", "hybrid", "queries", "pairs", "candidates")
TRANSFER_TABLES = ("hits@10", "first_hit")  # {method: number}
MAX_DESCRIBED_DEPTH = 8
_DROP = object()
_DROPPED_SAID: set[str] = set()


def _number(value) -> bool:
    """A finite JSON number that formats as a float (not a bool, not beyond float's range)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return math.isfinite(value) if isinstance(value, float) else abs(value) < 10**300


def _type_name(value) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__)


def _described(entry: dict, label: str, where: Path, *, metrics_in_info: bool = False) -> dict:
    """``entry`` (an operator's or head's manifest entry, a copy) without its descriptive fields of the
    wrong type, each dropped with a warning: ``{where}: {label}: {field} ...; dropped``."""
    check = _Described(where, label)
    metric_rules = {**dict.fromkeys(METRIC_TEXTS, check.text), **dict.fromkeys(METRIC_NUMBERS, check.number),
                    **dict.fromkeys(SCORE_TABLES, check.numbers)}
    transfer_rules = {**dict.fromkeys(TRANSFER_TEXTS, check.text), **dict.fromkeys(TRANSFER_NUMBERS, check.number),
                      **dict.fromkeys(TRANSFER_TABLES, check.numbers)}
    entry = dict(entry)
    if "description" in entry and check.text(entry["description"], "description") is _DROP:
        del entry["description"]
    holder = entry
    if metrics_in_info and isinstance(entry.get("info"), dict):
        holder = entry["info"] = dict(entry["info"])
    for key, rules, shown in (("metrics", metric_rules, "info.metrics" if metrics_in_info else "metrics"),
                              ("whole_corpus", dict.fromkeys(CORPUS_SPLITS, check.corpus_split), "whole_corpus"),
                              ("transfer", transfer_rules, "transfer")):
        if key in holder and not (metrics_in_info and key in ("whole_corpus", "transfer")):
            value = check.typed(holder[key], shown, rules)
            if value is _DROP:
                del holder[key]
            else:
                holder[key] = value
    return entry


class _Described:
    """The checks of :func:`_described` for one entry (``label``) of the bundle at ``where``: each
    returns the value it is given, or :data:`_DROP` after warning that the field is dropped."""

    def __init__(self, where: Path, label: str):
        self.where, self.label = where, label

    def drop(self, field: str, expected: str, value) -> object:
        line = (f"{self.where}: {self.label}: {field} must be {expected}, got {_type_name(value)}; dropped (it is "
                "only shown: the relation still works)")
        if line not in _DROPPED_SAID:  # once per process, though every generation loads the bundle again
            _DROPPED_SAID.add(line)
            log.warning("%s", line)
        return _DROP

    def finite(self, value, field: str, depth: int):
        """``value`` without NaN / infinite numbers and nesting beyond MAX_DESCRIBED_DEPTH."""
        if isinstance(value, float) and not math.isfinite(value):
            return self.drop(field, "a finite number", value)
        if isinstance(value, (dict, list)) and depth >= MAX_DESCRIBED_DEPTH:
            return self.drop(field, f"nested at most {MAX_DESCRIBED_DEPTH} deep", value)
        if isinstance(value, dict):
            kept = {k: self.finite(v, f"{field}.{k}", depth + 1) for k, v in value.items()}
            return {k: v for k, v in kept.items() if v is not _DROP}
        if isinstance(value, list):
            kept = [self.finite(v, f"{field}[{i}]", depth + 1) for i, v in enumerate(value)]
            return [v for v in kept if v is not _DROP]
        return value

    def typed(self, value, field: str, rules: dict):
        """``value`` an object whose keys named in ``rules`` hold what the rule checks, the rest finite."""
        if not isinstance(value, dict):
            return self.drop(field, "an object", value)
        out = {}
        for key, item in value.items():
            rule = rules.get(key)
            if rule is not None:
                item = rule(item, f"{field}.{key}")
            else:
                item = self.finite(item, f"{field}.{key}", 1)
            if item is not _DROP:
                out[key] = item
        return out

    def text(self, value, field: str):
        return value if isinstance(value, str) else self.drop(field, "a string", value)

    def number(self, value, field: str):
        return value if _number(value) else self.drop(field, "a finite number", value)

    def numbers(self, value, field: str):
        return self.typed(value, field, {k: self.number for k in value} if isinstance(value, dict) else {})

    def corpus_split(self, value, field: str):
        return self.typed(value, field, dict.fromkeys(CORPUS_NUMBERS, self.number))


def _check_tower(tower, where: str) -> None:
    """An encoder operator's ``tower``: name and base strings, a finite scale, a plain marker template."""
    if not isinstance(tower, dict):
        raise ValueError(f"{where} must be an object")
    for key in ("name", "base"):
        if not isinstance(tower.get(key), str) or not tower[key]:
            raise ValueError(f"{where}.{key} must be a non-empty string")
    scale = tower.get("scale")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"{where}.scale must be a finite number")
    try:
        marker_parts(tower.get("marker"))
    except ValueError as e:
        raise ValueError(f"{where}.marker: {e}") from None


def is_bundle(path: str | os.PathLike) -> bool:
    return (Path(path) / MANIFEST).is_file()


def default_bundle_path() -> str:
    """The relation pack shipped inside the package (relsearch/pack)."""
    return str(resources.files("relsearch") / "pack")


class ModelNotFoundError(ValueError):
    """``--model`` names neither a bundle nor a model that can be loaded."""


def recorded_ref(entry: dict) -> str | None:
    """The bundle or plain model an index was built with (``entry``: its manifest's ``bundle``):
    what commands on the index use without ``--model``. None when that was a folder which is gone
    (moved or deleted): the caller then uses the default pack."""
    ref = entry.get("ref") or entry.get("path")  # indexes written before "ref" recorded bundle folders only
    return None if ref and os.path.isabs(ref) and not os.path.isdir(ref) else ref


def load_bundle(ref: str | None = None, *, dim: int | None = None) -> Bundle:
    """Load a bundle folder, or wrap a plain model id/path as a bundle with only ``identity``.

    ``ref=None`` → the default relation pack (falls back to the bare default encoder if the pack
    is missing). ``dim`` (the encoder's) is checked against every operator. A ``ref`` that is
    neither a bundle nor a loadable model raises :class:`ModelNotFoundError` before any work.
    """
    if ref is None:
        ref = default_bundle_path()
        if not is_bundle(ref):
            ref = DEFAULT_MODEL
    if not is_bundle(ref):
        folder = _local_or_hub_folder(resolve_model_path(ref))
        if folder is None:
            from huggingface_hub.constants import HF_HUB_OFFLINE

            hub = "the Hugging Face hub is offline (HF_HUB_OFFLINE)" if HF_HUB_OFFLINE else "not on the Hugging Face hub"
            raise ModelNotFoundError(f"model {ref!r} not found: not a bundle or model folder, not an installed "
                                     f"package model, and {hub}")
        pooling = _read_st_folder(folder)[0]  # what the encoder will use: an index's identity records it
        return Bundle(encoder={"model": ref, "dim": dim, **({"pooling": pooling} if pooling else {})})
    root = Path(ref)
    where = root / MANIFEST
    try:
        manifest = json.loads(read_regular_file(where, limit=MAX_MANIFEST_BYTES))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ValueError(f"{where} is not valid JSON ({e.__class__.__name__})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise ValueError(f"{root}: unsupported bundle format {found!r} (expected {FORMAT})")
    _check_manifest(manifest, where)
    tensors = _load_tensors(root / TENSORS) if os.path.lexists(root / TENSORS) else {}
    encoder = dict(manifest["encoder"])
    if encoder.get("path"):  # fine-tuned weights stored inside the bundle (joint training)
        folder = inside(root, encoder["path"], what=f"{where}: encoder.path")
        if not folder.is_dir():
            raise ValueError(f"{where}: encoder.path {encoder['path']!r} is not a folder of the bundle")
        encoder["model"] = str(folder)
    try:
        operators = {}
        for entry in manifest["operators"]:
            entry = _described(entry, f"operator {entry['name']!r}", where)
            name, kind, desc = entry.pop("name"), entry.pop("kind"), entry.pop("description", "")
            tower = entry.get("tower") if kind == "encoder" else None
            prefix = TOWER_PREFIX + str(tower.get("name")) if isinstance(tower, dict) else name
            params = {k.split("/", 1)[1]: v for k, v in tensors.items()
                      if k.split("/", 1)[0] == prefix and not k.startswith(HEAD_PREFIX)}
            operators[name] = Operator(name=name, kind=kind, description=desc, params=params, info=entry)
        heads = {entry["name"]: PairHead.from_manifest(_described(entry, f"head {entry['name']!r}", where,
                                                                  metrics_in_info=True), tensors)
                 for entry in manifest.get("heads") or []}
        bundle = Bundle(encoder=encoder, operators=operators, path=str(root), info=manifest.get("info") or {},
                        heads=heads)
    except ValueError as e:  # shapes or parameters that do not fit: one line naming the bundle
        raise ValueError(f"{where}: {e}") from None
    if dim is not None and encoder.get("dim") not in (None, dim):
        raise ValueError(f"bundle {root} expects a {encoder['dim']}-d encoder, got {dim}-d")
    return bundle
