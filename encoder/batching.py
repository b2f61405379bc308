"""Texts → length-sorted, padded token batches as arrays, prepared ahead of the model.

On a GPU the host side is the limit (issue 14): tokenising into Python lists and padding row by
row ran at a fraction of what the model consumes. Here a window of texts is tokenised in one call
of the fast (Rust) tokenizer, padded by the tokenizer itself, turned into one int64 array, sorted
by length and cut into batches by numpy indexing — no per-row Python. :func:`prefetch` runs that
in a background thread, so the next window is tokenised while the model computes this one.

A batch of texts of mixed lengths (a micro-batch of short queries, 5 to 25 tokens) is *packed*:
several texts share a row, each attending only to its own tokens, with positions counted from its
own start (the Encoder builds the block-diagonal mask), so the model computes real tokens instead of
padding — the same vectors to float rounding. Length-sorted document batches pad little and stay
as they are.
"""
from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

# Widths are padded to a multiple of this: fewer distinct shapes means oneDNN/cuBLAS reuse their
# kernels instead of preparing new ones per sequence length.
WIDTH_MULTIPLE = 8
# Texts tokenised and length-sorted together. The first window is small so the model starts
# early; windows then double, because a wide window pads less (more texts share each length).
FIRST_WINDOW = 2048
MAX_WINDOW = 16384
# A batch is packed when packing computes at most this share of its padded tokens (above it, the
# saving is smaller than what the block-diagonal mask costs).
PACK_AT_MOST = 0.75
# On a CPU, rows of about 64 tokens run more tokens per second than the 16- to 40-token rows of
# length-sorted short texts, so there (``wide_rows``) 64- and 128-token rows are offered too, and
# a batch is packed into rows of 64 tokens or more whenever that computes no more tokens. Per-batch
# timing of 20,000 sentences (bf16, 2-core AMX Xeon, 2026-11-26): plain 24- to 40-token rows
# 32-37k tokens/s, packed 64-token rows 37-44k.
CPU_ROW_WIDTHS = (64, 128)


@dataclass(frozen=True)
class TokenBatch:
    """``rows``: (b,) positions of the texts in the encode input; ``input_ids`` and
    ``attention_mask``: (b, w) int64, w a multiple of :data:`WIDTH_MULTIPLE` (or max_length);
    ``truncated``: texts of this batch cut at max_length. A packed batch holds several texts per
    row: ``segments`` (r, w) gives each token's text as an index into ``rows`` (-1: padding) and
    ``position_ids`` (r, w) its position within that text."""

    rows: np.ndarray
    input_ids: np.ndarray
    attention_mask: np.ndarray
    truncated: int
    segments: np.ndarray | None = None
    position_ids: np.ndarray | None = None


HEAD_CHARS_PER_TOKEN = 64  # characters of a long text tokenised per token wanted


class Tokenize:
    """texts → (ids (n, w) int64 right-padded, lengths (n,), cut (n,) bool), each text at most
    ``max_length`` tokens with its final special token kept, as the tokenizer's truncation does.

    Texts are tokenised to ``max_length + 1`` so that a length above ``max_length`` tells which
    ones were cut. A fast tokenizer still normalises and splits a whole text before truncating (1.8 s
    for 64 texts of 100,000 characters), so it is given a text's first :data:`HEAD_CHARS_PER_TOKEN`
    characters per token; the head stands for the text when its kept tokens end before the head's
    last whitespace (the word the cut split lies past them), else the whole text is tokenised.
    """

    def __init__(self, tokenizer, max_length: int):
        self.max_length = max_length
        self.pad_id = tokenizer.pad_token_id or 0
        backend = getattr(tokenizer, "_tokenizer", None) if getattr(tokenizer, "is_fast", False) else None
        if backend is not None:  # a private copy: the transformers wrapper resets its truncation per call
            from tokenizers import Tokenizer

            self._fast = Tokenizer.from_str(backend.to_str())
            self._fast.enable_truncation(max_length + 1)
            self._fast.no_padding()  # padded here, vectorised (tokenizer.json may ask for padding)
        else:
            self._fast = None
            self._slow = tokenizer

    def __call__(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._fast is not None:
            seqs = self._fast_ids(texts)
            lengths = np.fromiter(map(len, seqs), np.int64, count=len(seqs))
            ids = np.full((len(seqs), int(lengths.max(initial=0))), self.pad_id, dtype=np.int64)
            ids[np.arange(ids.shape[1]) < lengths[:, None]] = np.fromiter(
                itertools.chain.from_iterable(seqs), np.int64, count=int(lengths.sum()))
        else:
            enc = self._slow(list(texts), truncation=True, max_length=self.max_length + 1, padding=True,
                             return_tensors="np", return_token_type_ids=False)
            ids, lengths = enc["input_ids"].astype(np.int64), enc["attention_mask"].sum(1).astype(np.int64)
        cut = lengths > self.max_length
        if cut.any():  # drop the last kept token, keep the final [SEP]-like one
            ids[cut, self.max_length - 1] = ids[cut, self.max_length]
            ids[cut, self.max_length] = self.pad_id
            lengths = np.minimum(lengths, self.max_length)
        width = min(_round_up(int(lengths.max(initial=1))), self.max_length)
        if ids.shape[1] < width:
            ids = np.pad(ids, ((0, 0), (0, width - ids.shape[1])), constant_values=self.pad_id)
        return np.ascontiguousarray(ids[:, :width]), lengths, cut


    def _fast_ids(self, texts: list[str]) -> list[list[int]]:
        """Each text's ids, truncated to ``max_length + 1``, from its head where the head gives the same."""
        limit = (self.max_length + 2) * HEAD_CHARS_PER_TOKEN
        heads = [text[:limit] for text in texts]
        encodings = self._fast.encode_batch(heads)  # parallel in Rust, without the GIL
        redo = [i for i, (text, head, e) in enumerate(zip(texts, heads, encodings))
                if len(text) > limit and not _ends_before_last_space(e, head)]
        for i, e in zip(redo, self._fast.encode_batch([texts[i] for i in redo])):
            encodings[i] = e
        return [e.ids for e in encodings]


def _ends_before_last_space(encoding, head: str) -> bool:
    """Whether every token of ``encoding`` (of ``head``) ends before the head's last whitespace."""
    ends = [end for (_, end), special in zip(encoding.offsets, encoding.special_tokens_mask) if not special]
    last_space = max(head.rfind(c) for c in " \n\t\r")
    return bool(ends) and ends[-1] <= last_space


def _round_up(n: int) -> int:
    return -(-n // WIDTH_MULTIPLE) * WIDTH_MULTIPLE


def token_batches(tokenize: Tokenize, texts: list[str], token_budget: int, *,
                  wide_rows: bool = False) -> Iterator[TokenBatch]:
    """Batches of at most ``token_budget`` padded tokens, longest texts first within each window;
    ``wide_rows`` (the CPU): short texts packed into rows of :data:`CPU_ROW_WIDTHS` tokens."""
    start, window = 0, FIRST_WINDOW
    while start < len(texts):
        ids, lengths, cut = tokenize(texts[start:start + window])
        order = np.argsort(-lengths, kind="stable")
        i = 0
        while i < len(order):
            width = min(_round_up(int(lengths[order[i]])), tokenize.max_length)
            rows = order[i:i + max(1, token_budget // width)]
            layout, row_width = cheapest_packing(lengths[rows], width, tokenize.max_length, wide_rows=wide_rows)
            plain, packed = len(rows) * width, len(layout) * row_width
            wide = wide_rows and row_width >= CPU_ROW_WIDTHS[0] and len(layout) < len(rows)
            if packed <= PACK_AT_MOST * plain or (wide and packed <= plain):
                yield packed_batch(rows + start, ids[rows], lengths[rows], layout, row_width, int(cut[rows].sum()))
            else:
                mask = (np.arange(width) < lengths[rows, None]).astype(np.int64)
                yield TokenBatch(rows + start, ids[rows, :width], mask, int(cut[rows].sum()))
            i += len(rows)
        start += window
        window = min(2 * window, MAX_WINDOW)


def pack(lengths: np.ndarray, width: int) -> list[list[int]]:
    """Rows of at most ``width`` tokens, as indices into ``lengths`` (sorted longest first): each row
    takes the longest text left, then the shortest ones while they fit (two pointers, one pass)."""
    rows, lo, hi = [], 0, len(lengths) - 1
    while lo <= hi:
        row, used = [lo], int(lengths[lo])
        lo += 1
        while lo <= hi and used + lengths[hi] <= width:
            row.append(hi)
            used += int(lengths[hi])
            hi -= 1
        rows.append(row)
    return rows


def cheapest_packing(lengths: np.ndarray, width: int, limit: int, *,
                     wide_rows: bool = False) -> tuple[list[list[int]], int]:
    """(layout, row width): :func:`pack` into rows of 1, 2 or 4 times the batch's padded ``width``
    (at most ``limit`` tokens), whichever computes the fewest tokens. Rows wider than the longest
    text let two or three short ones share a row (queries of 10 to 20 tokens pad to 24).
    ``wide_rows``: rows of :data:`CPU_ROW_WIDTHS` are offered too, and among equal token counts
    the width nearest 64 wins."""
    widths = {min(width * f, limit) for f in (1, 2, 4)}
    if wide_rows:
        widths |= {min(w, limit) for w in CPU_ROW_WIDTHS if w > width}
    nearest = CPU_ROW_WIDTHS[0] if wide_rows else 0  # ties: the narrowest width, or the one nearest 64
    return min(((pack(lengths, w), w) for w in widths), key=lambda o: (len(o[0]) * o[1], abs(o[1] - nearest)))


def packed_batch(rows: np.ndarray, ids: np.ndarray, lengths: np.ndarray, layout: list[list[int]], width: int,
                 truncated: int) -> TokenBatch:
    """The texts ``ids`` (n, ≥ max length) placed side by side in the rows of ``layout``."""
    row_of, offset = np.empty(len(lengths), np.int64), np.empty(len(lengths), np.int64)
    for r, members in enumerate(layout):
        row_of[members] = r
        offset[members] = np.concatenate([[0], np.cumsum(lengths[members])[:-1]])
    text, pos = np.nonzero(np.arange(ids.shape[1]) < lengths[:, None])  # every real token, text by text
    r, c = row_of[text], offset[text] + pos
    shape = (len(layout), width)
    input_ids, segments, positions = np.zeros(shape, np.int64), np.full(shape, -1, np.int64), np.zeros(shape, np.int64)
    input_ids[r, c], segments[r, c], positions[r, c] = ids[text, pos], text, pos
    return TokenBatch(rows, input_ids, (segments >= 0).astype(np.int64), truncated, segments, positions)


_DONE = object()


class _Failed:
    def __init__(self, error: BaseException):
        self.error = error


def prefetch(items: Iterable, depth: int = 2) -> Iterator:
    """Iterate ``items`` in a background thread, up to ``depth`` items ahead of the consumer.

    An exception in the producer is raised in the consumer; a consumer that stops early (an
    error in the model, a generator closed) stops the producer too.
    """
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                pass
        return False

    def produce():
        try:
            for item in items:
                if not put(item):
                    return
            put(_DONE)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, which raises it
            put(_Failed(e))

    thread = threading.Thread(target=produce, daemon=True, name="relsearch-tokenize")
    thread.start()
    try:
        while (item := q.get()) is not _DONE:
            if isinstance(item, _Failed):
                raise item.error
            yield item
    finally:
        stop.set()
        thread.join()
