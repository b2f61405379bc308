// A hit's snippet and its highlights (no DOM here): the answer's `highlights` are [start, end) offsets in
// code points of the hit's text (Python's str indices, retrieval/highlight.py); JavaScript strings index
// UTF-16 code units, so a text with characters past U+FFFF is mapped before it is cut.

const SURROGATE = /[\uD800-\uDFFF]/;

// How the server's warning for a highlight asked of a search without a BM25 part begins
// (retrieval/request.py NO_HIGHLIGHTS; tests/cli_api/test_explorer.py keeps the two alike)
export const NO_HIGHLIGHTS = "highlight marks the BM25 terms a hit matched";

// The ranges as UTF-16 [start, end), sorted, each within the text, none overlapping the one before;
// anything that is not a pair of integers is left out (an answer is data)
export function utf16Ranges(text, ranges) {
  if (!Array.isArray(ranges)) return [];
  const points = [...text].length;
  const valid = ranges.filter((r) => Array.isArray(r) && r.length === 2 && Number.isInteger(r[0]) &&
                                     Number.isInteger(r[1]) && r[0] >= 0 && r[0] < r[1] && r[1] <= points);
  let at = (i) => i;
  if (SURROGATE.test(text)) {
    const units = [0]; // code point i → UTF-16 index
    for (const c of text) units.push(units[units.length - 1] + c.length);
    at = (i) => units[i];
  }
  const sorted = valid.map(([s, e]) => [at(s), at(e)]).sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  const out = [];
  for (const r of sorted) if (!out.length || r[0] >= out[out.length - 1][1]) out.push(r);
  return out;
}

// Never cut between the two halves of a surrogate pair
function unitBoundary(text, i) {
  return i > 0 && i < text.length && /[\uDC00-\uDFFF]/.test(text[i]) && /[\uD800-\uDBFF]/.test(text[i - 1]) ? i - 1 : i;
}

// {cutBefore, cutAfter, parts: [[text, marked], ...]}: at most `width` characters of `text`, from its start
// or, when the first highlight lies past what that shows, from a little before it (at a word start),
// widened to a term it would cut; the highlighted runs inside that window marked
export function snippet(text, highlights, width = 220) {
  const full = typeof text === "string" ? text : String(text ?? "");
  const ranges = utf16Ranges(full, highlights);
  let start = 0;
  if (full.length > width && ranges.length && ranges[0][1] > width - 20) {
    start = Math.max(0, Math.min(ranges[0][0] - 40, full.length - width));
    const space = full.indexOf(" ", start);
    if (start > 0 && space >= 0 && space < ranges[0][0] && space - start < 30) start = space + 1;
  }
  start = unitBoundary(full, start);
  let end = unitBoundary(full, Math.min(full.length, start + width));
  for (const [s, e] of ranges) { // a term is marked whole or not shown: never half of one
    if (s < start && e > start) start = s;
    if (s < end && e > end) end = e;
  }
  const parts = [];
  let at = start;
  for (const [s, e] of ranges) {
    const from = Math.max(s, start);
    const to = Math.min(e, end);
    if (from >= to) continue;
    if (from > at) parts.push([full.slice(at, from), false]);
    parts.push([full.slice(from, to), true]);
    at = to;
  }
  if (at < end) parts.push([full.slice(at, end), false]);
  return {cutBefore: start > 0, cutAfter: end < full.length, parts};
}
