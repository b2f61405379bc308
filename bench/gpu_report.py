"""One GPU measurement in one device call (docs/gpu-notes.md): ``relsearch bench gpu-report``.

GPUs are lent to few sessions, so a GPU figure must cost one command. The report runs, each step
in its own process so that one failing step still leaves the others' figures:

1. ``relsearch bench speed --device DEVICE`` — encoding vs sentence-transformers and vs the model
   alone, the cosine floor to fp32, ``relsearch index`` vs pure encoding, queries vs raw FAISS;
2. a short query-tower run on a text knowledge graph — the documented command (docs/query-towers.md)
   ``relsearch train TRAIN --regime encoder --dev DEV --candidates ENTITIES --inverse
   --time-budget MINUTES`` with the trainer's defaults, and its test metrics;

and writes ``REPORT.md`` (with each step's command, wall time, exit status and output) and each
step's files under ``--out``.

Its inputs travel with the call as one folder, built here by ``relsearch bench gpu-report-data``
(``make gpu-report-data``)::

    sentences/stsb/pairs/*.jsonl, sentences/msrp/pairs/*.jsonl   bench speed's sentence pool
    kg/entities.jsonl.gz                                          {"id", "text"}
    kg/{train,dev,test}.tsv.gz                                    head_id <TAB> relation <TAB> tail_id

The knowledge graph goes by ids (CoDEx-M's text triples are over 100 MB, a call carries 64 MiB)
and is expanded to text triples where the report runs. ``--tiny`` is the CPU dry run the default
test suite makes, so the report cannot rot between GPU sessions.
"""
from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

SPLITS = ("train", "dev", "test")


@dataclass(frozen=True, kw_only=True)
class Sizes:
    """How much each step does: the GPU run's sizes, or the CPU dry run's (``tiny``)."""

    sentences: int
    documents: int
    repeats: int
    tower_minutes: float
    test_triples: int | None  # test triples the tower is scored on (None: all)
    speed_timeout_s: int

    @property
    def tower_timeout_s(self) -> int:  # the budget, plus loading, the entity table and the test scoring
        return int(self.tower_minutes * 60) + 90

    @classmethod
    def of(cls, tiny: bool, tower_minutes: float | None = None) -> Sizes:
        """The GPU run fits one 10-minute device call: at most 270 s of bench speed, 270 s of tower."""
        if tiny:
            return cls(sentences=64, documents=300, repeats=1, tower_minutes=tower_minutes or 0.2,
                       test_triples=40, speed_timeout_s=300)
        return cls(sentences=100_000, documents=50_000, repeats=3, tower_minutes=tower_minutes or 3.0,
                   test_triples=2_000, speed_timeout_s=270)


# ---- the folder that travels ---------------------------------------------------------------------

def pack_data(data_dir: Path, kg_dir: Path, out: Path) -> dict[str, int]:
    """Write the report's inputs into ``out`` from the datasets folder ``data_dir`` (STS-B and
    MSRP pairs) and a text knowledge graph ``kg_dir`` normalised as tools/data/codex.py writes it
    (``entities.jsonl``, ``triples/{split}.jsonl`` with ``head_id``, ``relation``, ``tail_id``).
    Returns counts. ``out`` is replaced."""
    if out.exists():
        shutil.rmtree(out)
    for name in ("stsb", "msrp"):
        shutil.copytree(data_dir / name / "pairs", out / "sentences" / name / "pairs")
    (out / "kg").mkdir(parents=True)
    counts = {}
    with open(kg_dir / "entities.jsonl", "rb") as src, gzip.open(out / "kg" / "entities.jsonl.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    for split in SPLITS:
        n = 0
        with open(kg_dir / "triples" / f"{split}.jsonl", encoding="utf-8") as src, \
                gzip.open(out / "kg" / f"{split}.tsv.gz", "wt", encoding="utf-8") as dst:
            for line in src:
                t = json.loads(line)
                dst.write(f"{t['head_id']}\t{t['relation']}\t{t['tail_id']}\n")
                n += 1
        counts[split] = n
    return counts


def expand_kg(kg: Path, into: Path, *, test_triples: int | None = None) -> dict[str, Path]:
    """Text triples ``{"head", "relation", "tail"}`` per split and the entity corpus, written under
    ``into`` from the id form of :func:`pack_data`; the first ``test_triples`` of test only."""
    into.mkdir(parents=True, exist_ok=True)
    with gzip.open(kg / "entities.jsonl.gz", "rt", encoding="utf-8") as f:
        text = {row["id"]: row["text"] for row in map(json.loads, f)}
    paths = {"entities": into / "entities.jsonl"}
    with open(paths["entities"], "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"id": i, "text": t}, ensure_ascii=False) + "\n" for i, t in text.items())
    for split in SPLITS:
        paths[split] = into / f"{split}.jsonl"
        with gzip.open(kg / f"{split}.tsv.gz", "rt", encoding="utf-8") as src, \
                open(paths[split], "w", encoding="utf-8") as dst:
            for n, line in enumerate(src):
                if split == "test" and test_triples is not None and n >= test_triples:
                    break
                head, relation, tail = line.rstrip("\n").split("\t")
                dst.write(json.dumps({"head": text[head], "relation": relation, "tail": text[tail]},
                                     ensure_ascii=False) + "\n")
    return paths


# ---- the run -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Step:
    name: str
    command: list[str]
    seconds: float
    returncode: int | None  # None: stopped at the step's timeout
    output: str


def _step(name: str, command: list[str], *, env: dict, timeout_s: int, log: Path) -> Step:
    """Run one step as its own process; its whole output goes to ``log``."""
    started = time.perf_counter()
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s)
        code, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as e:
        code = None
        output = "".join(x.decode(errors="replace") if isinstance(x, bytes) else (x or "") for x in (e.stdout, e.stderr))
        output += f"\n[stopped after {timeout_s} s]"
    log.write_text(output, encoding="utf-8")
    return Step(name, command, time.perf_counter() - started, code, output)


def run(*, device: str, data: Path, out: Path, tiny: bool = False, tower_minutes: float | None = None) -> Path:
    """Run every step on ``device`` with the inputs folder ``data`` (:func:`pack_data`); write
    ``out/REPORT.md`` and return its path."""
    sizes = Sizes.of(tiny, tower_minutes)
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RELSEARCH_DATA": str((data / "sentences").resolve())}
    relsearch = [sys.executable, "-m", "relsearch"]
    kg = expand_kg(data / "kg", out / "kg", test_triples=sizes.test_triples)
    steps = [
        _step("bench speed", [*relsearch, "bench", "speed", "--device", device, "--sentences", str(sizes.sentences),
                              "--documents", str(sizes.documents), "--repeats", str(sizes.repeats),
                              "--json", str(out / "speed.json")],
              env=env, timeout_s=sizes.speed_timeout_s, log=out / "speed.log"),
        _step("query tower", [*relsearch, "train", str(kg["train"]), "--regime", "encoder", "--dev", str(kg["dev"]),
                              "--test", str(kg["test"]), "--candidates", str(kg["entities"]), "--inverse",
                              "--time-budget", f"{sizes.tower_minutes:g}", "--out", str(out / "tower"), "--quiet"],
              env=env, timeout_s=sizes.tower_timeout_s, log=out / "tower.log"),
    ]
    report = out / "REPORT.md"
    report.write_text(render(device, sizes, steps, out), encoding="utf-8")
    return report


def render(device: str, sizes: Sizes, steps: list[Step], out: Path) -> str:
    """REPORT.md: the machine, then per step its command, wall time, status and output."""
    from .report import machine_info

    machine = machine_info()
    lines = [f"# relsearch GPU report ({device}{', tiny CPU dry run' if device == 'cpu' else ''})", "",
             f"- when: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
             f"- machine: {machine['cpu']}, {machine['usable_cpus']} usable CPUs, GPU {machine['gpu'] or 'none'}",
             f"- sizes: {sizes}", ""]
    for step in steps:
        status = "stopped at its timeout" if step.returncode is None else f"exit {step.returncode}"
        lines += [f"## {step.name}: {status}, {step.seconds:.0f} s", "",
                  "```", " ".join(step.command), "```", "", "```", _tail(step.output), "```", ""]
    card = out / "tower" / "MODEL_CARD.md"
    if card.is_file():
        lines += ["## query tower: its model card", "", card.read_text(encoding="utf-8")]
    return "\n".join(lines) + "\n"


def _tail(text: str, lines: int = 60) -> str:
    """The last ``lines`` lines, without progress-bar redraws."""
    kept = [line.rsplit("\r", 1)[-1] for line in text.splitlines() if line.strip()]
    return "\n".join(kept[-lines:])
