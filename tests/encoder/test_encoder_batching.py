"""encoder/batching.py: array tokenisation, length-sorted batches, the background prefetch."""
import threading

import numpy as np
import pytest

from relsearch.encoder import batching, model
from relsearch.encoder.batching import TokenBatch, Tokenize, prefetch, token_batches
from test_encoder import cos, texts

MIXED = ["short one", "", "word " * 300, "[PAD] is a literal here", "ünïcødé — text", "a b", "word " * 254,
         "word " * 255]


class _SlowOnly:
    """The same tokenizer seen as a slow (Python) one, to cover Tokenize's fallback path."""

    is_fast = False

    def __init__(self, tokenizer):
        self._t = tokenizer
        self.pad_token_id = tokenizer.pad_token_id

    def __call__(self, *args, **kwargs):
        return self._t(*args, **kwargs)


@pytest.fixture(scope="module")
def hf_tokenizer(encoder):
    """transformers' tokenizer of the encoder's folder: the reference (the encoder itself may run
    encoder/bert.py's, which is the same tokenizers object without transformers around it)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(encoder.path)


@pytest.mark.parametrize("slow", [False, True])
def test_tokenize_matches_the_tokenizers_truncation_row_by_row(encoder, hf_tokenizer, slow):
    tok = hf_tokenizer
    tokenize = Tokenize(_SlowOnly(tok) if slow else encoder.tokenizer, encoder.max_length)
    ids, lengths, cut = tokenize(MIXED)
    assert ids.dtype == np.int64 and ids.shape[1] % batching.WIDTH_MULTIPLE == 0 or ids.shape[1] == encoder.max_length
    for row, text in enumerate(MIXED):
        want = tok(text, truncation=True, max_length=encoder.max_length)["input_ids"]
        assert ids[row, :lengths[row]].tolist() == want
        assert (ids[row, lengths[row]:] == tok.pad_token_id).all()
        assert cut[row] == (len(tok(text)["input_ids"]) > encoder.max_length)
    assert cut.sum() == 2  # "word " * 300 and * 255 (255 words + [CLS] + [SEP] = 257 > 256)


LONG = ["word " * 20_000, "   " * 10_000 + "word " * 300, "x" * 40_000 + " tail", "a\n" * 30_000,
        "ünïcødé " * 9_000, " ".join(["supercalifragilisticexpialidocious"] * 3_000)]


def test_a_long_texts_head_stands_for_it_only_when_it_gives_the_same_ids(encoder, hf_tokenizer):
    """Issue 50, F-3: long texts are tokenised from their head (64 characters per token wanted),
    whitespace runs, one huge word and repeated long words included: the same ids as the whole text."""
    ids, lengths, cut = Tokenize(encoder.tokenizer, encoder.max_length)(LONG)
    for row, text in enumerate(LONG):
        want = hf_tokenizer(text, truncation=True, max_length=encoder.max_length)["input_ids"]
        assert ids[row, :lengths[row]].tolist() == want, row
    assert cut.tolist() == [len(hf_tokenizer(t)["input_ids"]) > encoder.max_length for t in LONG]


def test_batches_cover_every_text_once_within_the_token_budget(encoder, hf_tokenizer, monkeypatch):
    monkeypatch.setattr(batching, "FIRST_WINDOW", 3)  # several windows: 3, 6, ...
    sample = texts(20) + MIXED
    batches = list(token_batches(Tokenize(encoder.tokenizer, encoder.max_length), sample, token_budget=512))
    rows = np.concatenate([b.rows for b in batches])
    assert sorted(rows.tolist()) == list(range(len(sample)))
    long = sum(len(hf_tokenizer(t)["input_ids"]) > encoder.max_length for t in sample)
    assert long >= 2 and sum(b.truncated for b in batches) == long
    for b in batches:
        assert b.input_ids.shape == b.attention_mask.shape
        assert b.input_ids.size <= 512 or len(b.rows) == 1
        assert (b.attention_mask.sum(1) >= 2).all()  # at least [CLS] and [SEP]


def test_windowed_prefetched_encoding_equals_one_window(encoder, monkeypatch):
    sample = [t[:80] for t in texts(24)] + MIXED[:4]  # short texts keep it fast; one is cut
    whole = model.Encoder.encode(encoder, sample)
    monkeypatch.setattr(model, "FIRST_WINDOW", 4)  # take the threaded path
    monkeypatch.setattr(batching, "FIRST_WINDOW", 4)
    monkeypatch.setattr(model, "PENDING_ROWS", 5)  # and several copies back
    seen = []
    windowed = encoder.encode(sample, progress=seen.append)
    assert sum(seen) == len(sample) and windowed.truncated == whole.truncated == 1
    assert cos(windowed.vectors, whole.vectors).min() > 0.9995


def test_bf16_stays_within_cosine_0999_of_fp32():
    sample = [t[:100] for t in texts(6)] + MIXED[:2]  # bf16 without CPU bf16 units is slow: keep it small
    fp32 = model.Encoder(model.EncoderConfig(precision="fp32")).encode(sample).vectors
    bf16 = model.Encoder(model.EncoderConfig(precision="bf16")).encode(sample).vectors
    assert cos(bf16, fp32).min() >= 0.999


def test_prefetch_keeps_order_and_raises_the_producers_error():
    assert list(prefetch(iter(range(50)), depth=2)) == list(range(50))

    def failing():
        yield 1
        raise ValueError("tokenizer broke")

    got = []
    with pytest.raises(ValueError, match="tokenizer broke"):
        for x in prefetch(failing()):
            got.append(x)
    assert got == [1]


def test_prefetch_stops_its_thread_when_the_consumer_stops():
    produced = []

    def endless():
        i = 0
        while True:
            produced.append(i)
            yield i
            i += 1

    before = threading.active_count()
    it = prefetch(endless(), depth=2)
    assert next(it) == 0
    it.close()  # the consumer gives up (e.g. the model raised)
    assert threading.active_count() == before and len(produced) <= 4


def test_token_batch_is_what_the_model_reads(encoder):
    batch = next(token_batches(Tokenize(encoder.tokenizer, encoder.max_length), ["a b c"], 64))
    assert isinstance(batch, TokenBatch) and batch.rows.tolist() == [0] and batch.attention_mask.sum() == 5


def test_pack_places_every_text_once_within_the_row_width():
    lengths = np.array([25, 20, 17, 15, 14, 12, 9, 5, 5])
    for width in (25, 32, 48):
        layout = batching.pack(lengths, width)
        assert sorted(i for row in layout for i in row) == list(range(len(lengths)))
        assert all(lengths[row].sum() <= width for row in layout)
    assert batching.pack(lengths, 32) == [[0, 8], [1, 7], [2, 6], [3, 5], [4]]
    layout, width = batching.cheapest_packing(lengths, 32, 256)
    assert len(layout) * width < len(lengths) * 32  # fewer tokens than padding every text to 32


@pytest.fixture(scope="module")
def fp32_encoder():
    """Exact comparisons need fp32: on CPUs where ``auto`` picks bf16, rows of other widths round
    differently (bf16 keeps cosine >= 0.999 to fp32, not 1e-5 per coordinate)."""
    return model.Encoder(model.EncoderConfig(precision="fp32"))


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_packed_batches_give_the_vectors_of_padded_ones(fp32_encoder, monkeypatch, pooling):
    """Short texts of mixed lengths (a micro-batch of queries) share rows; each attends only to
    itself, so its vector is the one it gets padded in its own row."""
    encoder = fp32_encoder
    monkeypatch.setattr(encoder, "pooling", pooling)
    sample = ["a b", "oil and gas exploration and production in texas", "banks", "cloud software for enterprises",
              "operates hospitals and outpatient surgery centers in the united states", "", "ünïcødé — text"] * 3
    batches = list(token_batches(encoder.tokenize, sample, encoder.token_budget))
    assert len(batches) == 1 and batches[0].segments is not None  # packed
    b = batches[0]
    assert (b.segments >= 0).sum() == encoder.tokenize(sample)[1].sum()  # every real token once, no padding inside
    packed = model.Encoder.encode(encoder, sample).vectors
    monkeypatch.setattr(batching, "PACK_AT_MOST", 0.0)  # never pack
    assert next(token_batches(encoder.tokenize, sample, encoder.token_budget)).segments is None
    padded = model.Encoder.encode(encoder, sample).vectors
    np.testing.assert_allclose(packed, padded, atol=1e-5)
    one = np.stack([model.Encoder.encode(encoder, [t]).vectors[0] for t in sample[:7]])
    np.testing.assert_allclose(packed[:7], one, atol=1e-5)


def test_on_the_cpu_short_texts_of_one_length_share_wide_rows(fp32_encoder):
    """Length-sorted short texts pad little, so the token count alone never packed them; on the CPU
    (``wide_rows``) they share 64-token rows, which run more tokens per second, and keep their
    vectors. A single text keeps its own row."""
    encoder = fp32_encoder
    sample = ["oil and gas exploration"] * 40  # 6 tokens each, padded to 8
    narrow = next(token_batches(encoder.tokenize, sample, encoder.token_budget))
    wide = next(token_batches(encoder.tokenize, sample, encoder.token_budget, wide_rows=True))
    assert narrow.segments is None and wide.segments is not None and wide.input_ids.shape == (4, 64)
    assert next(token_batches(encoder.tokenize, sample[:1], encoder.token_budget, wide_rows=True)).segments is None
    assert encoder.device == "cpu"  # so encode() below runs the wide rows
    alone = encoder.encode(sample[:1]).vectors[0]
    np.testing.assert_allclose(encoder.encode(sample).vectors, np.tile(alone, (40, 1)), atol=1e-5)
