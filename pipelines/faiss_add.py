"""The index job's FAISS add on the Beam runner's workers: a trained IVF index is filled, unit by
unit, where the encoded shards are, and the driver merges the filled units in order.

The driver trains the coarse quantizer (and PQ codebooks) once, on a sample of ``vectors.npy``
(indexer/faiss_index.py), and hands the trained empty index to :class:`WorkerAdd`, its
``FaissSpec.fill``. That writes the index beside the encoded shards and runs a second pipeline of
the encoding pipeline's runner-neutral shape (pipelines/runners.py): ``Create(units) → Reshuffle →
ParDo(unit → filled index file)``. A unit is a run of consecutive encoded chunks. Its worker reads
their vectors through Beam's FileSystems (no shared mount), keeps the records the driver kept
(later duplicates of an id are dropped), normalises them as the driver's ``vectors.npy`` rows are
(indexer/build.py ``unit_rows``) and adds them with ids = their positions
(indexer/sharded_add.py ``add_shard``). The driver merges the units' inverted lists in unit
order, so the index holds exactly the entries one in-process add makes.

Memory per worker: the trained index (nlist·d·4 B of centroids + codebooks), one chunk's vectors
and its unit's codes, (n/units)·(code_size + 8) B, twice while it is serialized.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import faults
from ..indexer import sharded_add
from ..indexer.rowfile import unit_rows
from . import shardfs
from .assemble import kept_vectors
from .runners import new_pipeline, run_to_end

ROWS_PER_UNIT = 1_000_000  # automatic unit count: one per this many documents (below it, the driver adds alone)
TRAINED_FILE = "faiss-trained.index"
UNIT_PREFIX = "faiss-add-"


@dataclass(frozen=True)
class AddUnit:
    """Consecutive encoded chunks whose kept rows take positions ``first``, ``first`` + 1, …"""

    number: int
    first: int
    chunks: tuple[tuple[int, np.ndarray], ...]  # (chunk number, its kept-record mask)


def units_for(n: int, requested: int) -> int:
    """How many add units: ``requested``, or with 0 one per :data:`ROWS_PER_UNIT` documents."""
    return requested if requested > 0 else math.ceil(n / ROWS_PER_UNIT)


def plan_units(chunks, keep: list[np.ndarray], units: int) -> list[AddUnit]:
    """Cut the chunks holding kept records into at most ``units`` runs of about equal row counts;
    a chunk belongs to the unit its first position falls in."""
    n = int(sum(int(k.sum()) for k in keep))
    runs, first = [], 0
    for chunk, mask in zip(chunks, keep):
        if not mask.any():
            continue
        share = first * units // n
        if not runs or runs[-1][0] != share:
            runs.append((share, first, []))
        runs[-1][2].append((chunk.number, mask))
        first += int(mask.sum())
    return [AddUnit(i, start, tuple(parts)) for i, (_, start, parts) in enumerate(runs)]


def unit_blocks(shard_dir: str, unit: AddUnit):
    """(first position, unit rows) per chunk of ``unit``, read from the encoded shards."""
    first = unit.first
    for number, mask in unit.chunks:
        rows, _ = unit_rows(kept_vectors(shard_dir, number, mask))
        yield first, rows
        first += len(rows)


def unit_file(shard_dir: str, number: int) -> str:
    return shardfs.join(shard_dir, f"{UNIT_PREFIX}{number:04d}.index")


def _add_units_dofn(shard_dir: str, threads: int | None):
    import apache_beam as beam

    class AddUnits(beam.DoFn):
        """Fills a copy of the trained index with one unit's rows; writes it beside the shards."""

        def setup(self):
            self._trained = shardfs.read(shardfs.join(shard_dir, TRAINED_FILE))

        def process(self, unit: AddUnit):
            filled = sharded_add.add_shard(self._trained, unit_blocks(shard_dir, unit), threads=threads)
            shardfs.write(unit_file(shard_dir, unit.number), filled)
            faults.point("index.faiss-unit-written")

    return AddUnits()


@dataclass(frozen=True)
class WorkerAdd:
    """A ``FaissSpec.fill`` that adds on the Beam runner's workers (``options``: the index job's)."""

    shard_dir: str  # the encoded shards (any FileSystems location)
    scratch: Path  # the job's local build folder, for Beam's own scratch files
    units: tuple[AddUnit, ...]
    options: object  # PipelineOptions
    threads: int | None = None  # FAISS threads per worker (None: FAISS's default)

    def __call__(self, index, vectors):
        import apache_beam as beam

        stale = [p for p in shardfs.names(self.shard_dir, ".index") if p.rsplit("/", 1)[-1].startswith(UNIT_PREFIX)]
        shardfs.remove(stale)  # a killed run's units may come from another training
        trained = shardfs.join(self.shard_dir, TRAINED_FILE)
        shardfs.write(trained, sharded_add.serialize(index))
        p = new_pipeline(self.options, self.scratch)
        (p
         | "AddUnits" >> beam.Create(list(self.units))
         | "SpreadUnits" >> beam.Reshuffle()
         | "Add" >> beam.ParDo(_add_units_dofn(self.shard_dir, self.threads)))
        run_to_end(p)
        for unit in self.units:  # in unit order: the merged lists hold ids in the order one add would
            path = unit_file(self.shard_dir, unit.number)
            sharded_add.merge_shard(index, shardfs.read(path))
            shardfs.remove([path])
        shardfs.remove([trained])
        return index
