"""Shared fixtures: a real encoder and a small real index, built once per test session."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
# the prepared public datasets (docs/datasets.md): $RELSEARCH_DATA, as the bench commands read it
SHARED_DATA = Path(os.environ.get("RELSEARCH_DATA") or REPO.parent / "shared" / "data")
DEMO_CORPUS = REPO / "relsearch" / "data" / "sp500_2017.jsonl"


def demo_texts(n: int = 40) -> list[str]:
    """The first ``n`` company descriptions of the demo corpus."""
    return [json.loads(line)["text"] for line in DEMO_CORPUS.read_text().splitlines()[:n]]


def shared(*parts: str) -> Path:
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"shared dataset {path} not available")
    return path


@pytest.fixture(autouse=True, scope="session")
def auto_precision():
    """``RELSEARCH_TEST_AUTO_PRECISION=bf16`` (make test-bf16): ``auto`` precision picks bf16 as an
    AVX-512 BF16 or AMX machine does, so an AVX2-only machine runs the suite that machine would: the
    CPU's flags and the timing probe are what such a machine reports, and the choice itself is the
    real one (a test of it passes its own flags and probe). ``=fp32`` (make test-fp32) is the other
    way round: a bf16 machine reports no bf16 flags and runs the suite an AVX2-only machine would."""
    mode = os.environ.get("RELSEARCH_TEST_AUTO_PRECISION")
    if mode not in ("bf16", "fp32"):
        yield
        return
    from relsearch.encoder import precision

    patch = pytest.MonkeyPatch()
    if mode == "bf16":
        patch.setattr(precision, "cpu_bf16_flags", lambda *a, **k: frozenset({"amx_bf16"}))
        patch.setattr(precision, "matmul_probe", lambda *a, **k: (2.0, 1.0))  # bf16 twice fp32's speed
    else:
        patch.setattr(precision, "cpu_bf16_flags", lambda *a, **k: frozenset())
    yield
    patch.undo()


@pytest.fixture(scope="session")
def encoder():
    from relsearch.encoder.model import Encoder, EncoderConfig

    return Encoder(EncoderConfig())


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory) -> Path:
    """The first 120 demo companies, real text and metadata."""
    path = tmp_path_factory.mktemp("corpus") / "companies.jsonl"
    lines = DEMO_CORPUS.read_text().splitlines()[:120]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="session")
def small_index(tmp_path_factory, small_corpus) -> Path:
    """A published index of ``small_corpus`` built by the real Beam pipeline (in-process)."""
    from relsearch.pipelines.index import IndexJob, run_index

    target = tmp_path_factory.mktemp("idx") / "companies"
    report = run_index(IndexJob(input=str(small_corpus), index=str(target), progress=False))
    assert report.indexed == 120 and report.published
    return target


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def gen_of(index) -> str:
    """The generation folder the index at ``index`` publishes now (``DIR/current``), as a string."""
    from relsearch.indexer import store

    return str(store.current_generation(index))


def copy_published(src, dest, name: str | None = None) -> Path:
    """``dest``: a new index folder publishing a copy of ``src``'s published generation (renamed
    ``name``), without its snapshots or history."""
    import shutil

    from relsearch.indexer import store

    gen = store.current_generation(src)
    dest = Path(dest)
    shutil.copytree(gen, dest / store.GENERATIONS / (name or gen.name))
    (dest / store.CURRENT).write_text((name or gen.name) + "\n")
    return dest


def legacy_copy(src, dest) -> Path:
    """``dest`` in the layout before one-folder indexes: a symlink to ``.DEST.generations/<gen>``, a
    copy of ``src``'s published generation, with ``.DEST.history.json`` beside it."""
    import shutil

    from relsearch.indexer import store

    gen = store.current_generation(src)
    dest = Path(dest)
    gens = dest.parent / f".{dest.name}.generations"
    shutil.copytree(gen, gens / gen.name)
    (dest.parent / f".{dest.name}.history.json").write_text(json.dumps({"keep": 3, "published": [gen.name]}) + "\n")
    os.symlink(os.path.relpath(gens / gen.name, dest.parent), dest)
    return dest
