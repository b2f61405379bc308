// Drawing: hits with rank movement and their score's parts, bar charts, relation rows, the why-not box. Text goes
// in as text nodes only.
import {snippet} from "./marks.js";
import {SCALES, cosines, describe, readRecipe, scoreParts} from "./recipe.js";

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (name === "class") node.className = value;
    else if (value !== undefined && value !== null && value !== false) node.setAttribute(name, value);
  }
  node.append(...children.flat().filter((c) => c !== null && c !== undefined));
  return node;
}

// A row of chips folded after its first `shown`: a "more (N)" button (aria-expanded) shows the rest in place,
// "fewer" hides them again; `open` starts it unfolded and `onToggle(open)` hears each change. A row of at most
// `shown` chips is returned as it is.
export function folded(chips, {shown = 10, open = false, what = "values", onToggle = () => {}} = {}) {
  if (chips.length <= shown) return chips;
  const rest = chips.slice(shown);
  const toggle = el("button", {type: "button", class: "more"});
  const show = (unfolded) => {
    rest.forEach((chip) => { chip.hidden = !unfolded; });
    toggle.setAttribute("aria-expanded", String(unfolded));
    toggle.textContent = unfolded ? "fewer" : `more (${rest.length})`;
    toggle.title = unfolded ? `show only the first ${shown} ${what}` : `show the other ${rest.length} ${what}`;
  };
  show(open);
  toggle.addEventListener("click", () => {
    const unfolded = toggle.getAttribute("aria-expanded") !== "true";
    show(unfolded);
    onToggle(unfolded);
  });
  return [...chips, toggle];
}

const round = (x, digits = 3) => (typeof x === "number" ? x.toFixed(digits) : String(x));

// One labelled bar per entry; a cosine of -1..1 fills from the middle, anything else from 0 up to the largest
export function bars(entries, {signed = true, highlight = new Set()} = {}) {
  const top = Math.max(1e-9, ...entries.map(([, v]) => Math.abs(v)));
  return el("div", {class: "bars"}, entries.map(([label, value]) => {
    const fill = el("span", {class: `fill${value < 0 ? " negative" : ""}`});
    const share = signed ? Math.min(1, Math.abs(value)) : Math.abs(value) / top;
    fill.style.width = `${(signed ? 50 : 100) * share}%`;
    if (signed && value >= 0) fill.style.left = "50%";
    if (signed && value < 0) fill.style.right = "50%";
    return el("div", {class: `bar${highlight.has(label) ? " chosen" : ""}`, title: `${label}: ${value}`},
      el("span", {class: "label"}, label), el("span", {class: `track${signed ? " signed" : ""}`}, fill),
      el("span", {class: "value"}, round(value)));
  }));
}

// The range one list's score tracks span, [lo, hi]: from 0 (or the most negative sum of parts) to the
// mode's top (1; rrf's 2/61) or the largest sum of positive parts, so lengths compare within a list
function trackRange(partsOfHits, mode) {
  let lo = 0;
  let hi = mode === "rrf" ? 2 / 61 : 1;
  for (const parts of partsOfHits) {
    hi = Math.max(hi, parts.filter((p) => p.value > 0).reduce((t, p) => t + p.value, 0));
    lo = Math.min(lo, parts.filter((p) => p.value < 0).reduce((t, p) => t + p.value, 0));
  }
  return {lo, hi};
}

// A hit's score as its parts stacked on one track: positive parts rightwards from 0, negative ones
// (past the recipe's pool) leftwards from it, each as long as its value on the list's [lo, hi]
export function stack(parts, {lo, hi}) {
  const span = hi - lo || 1;
  let right = (-lo / span) * 100;
  let left = right;
  let mixed = 0;
  const segments = parts.map((part) => {
    const width = (Math.abs(part.value) / span) * 100;
    const kind = part.kind === "mixture" ? `part-mixture mix-${mixed++ % 6}` : `part-${part.kind}`;
    const segment = el("span", {class: `seg ${kind}${part.value < 0 ? " negative" : ""}`, "data-part": part.key,
                                "data-value": String(part.value), title: `${part.label}: ${round(part.value, 4)}`});
    if (part.value >= 0) {
      segment.style.left = `${right}%`;
      right += width;
    } else {
      left -= width;
      segment.style.left = `${left}%`;
    }
    segment.style.width = `${width}%`;
    return segment;
  });
  const zero = lo < 0 ? el("span", {class: "zero"}) : null;
  if (zero) zero.style.left = `${(-lo / span) * 100}%`;
  mixed = 0;
  const legend = parts.map((part, i) => el("span", {class: "part"},
    i && part.value >= 0 ? " + " : i ? " − " : part.value < 0 ? "−" : "",
    el("i", {class: `swatch ${part.kind === "mixture" ? `part-mixture mix-${mixed++ % 6}` : `part-${part.kind}`}`}),
    `${part.label} ${round(Math.abs(part.value))}`));
  return el("div", {class: "stack", "data-lo": String(lo), "data-hi": String(hi)},
    el("div", {class: "stack-track"}, zero, segments),
    parts.length > 1 ? el("div", {class: "legend"}, legend) : null);
}

function movement(rank, before) {
  if (before === undefined) return el("span", {class: "move new", title: "not in identity's top k"}, "new");
  const delta = before - rank;
  if (delta === 0) return el("span", {class: "move same", title: "same rank as identity"}, "=");
  return el("span", {class: `move ${delta > 0 ? "up" : "down"}`, title: `rank ${before} under identity`},
    `${delta > 0 ? "↑" : "↓"}${Math.abs(delta)}`);
}

// The hit's text (its first 220 characters, or those around its first highlight) with the query's BM25
// terms in <mark>s: text nodes only, whatever the text holds
function snippetOf(hit) {
  const shown = snippet(hit.text, hit.highlights);
  const marked = Array.isArray(hit.highlights);
  return el("p", {class: "snippet", "data-highlights": marked ? String(hit.highlights.length) : null},
    shown.cutBefore ? "…" : null,
    shown.parts.map(([text, mark]) => (mark ? el("mark", {}, text) : text)),
    shown.cutAfter ? "…" : null);
}

// before: id → rank under identity (the mixture list shows movement); kept: ids the mixture kept (identity list);
// mode: the answer's mode (what its query plan ran), whose scale labels each score; single: what a score of one part is called;
// next: hit → the URL of the same search with that hit as its stored document (a link on each hit)
export function hitList(list, hits, {columns, mode = "dense", single = "cosine", before = null, kept = null,
                                     chosen = new Set(), next = null}) {
  const scale = SCALES[mode] || SCALES.dense;
  const partsOfHits = hits.map((hit) => scoreParts(hit, mode, single));
  const range = trackRange(partsOfHits, mode);
  list.dataset.mode = mode;
  list.replaceChildren(...hits.map((hit, i) => {
    const rest = cosines(hit);
    return el("li", {class: `hit${kept && !kept.has(hit.id) ? " dropped" : ""}`, "data-id": hit.id},
      el("div", {class: "head"},
        el("span", {class: "rank"}, `${hit.rank}.`),
        before ? movement(hit.rank, before.get(hit.id)) : null,
        el("strong", {class: "id"}, hit.id),
        hit.field ? el("span", {class: "matched-field", title: "the text whose score this is"}, hit.field) : null,
        el("span", {class: "score", title: scale.title, "data-score": String(hit.score)},
          el("span", {class: "scale"}, scale.label), " ", el("span", {class: "value"}, round(hit.score, 4))),
        next ? el("a", {class: "next-query", href: next(hit), title: `search from ${hit.id}: the same relations and ` +
                        "filters, this hit as the query (Back returns here)"}, "→ query") : null),
      columns.length ? el("dl", {class: "meta"}, columns.flatMap((c) => isObject(hit.metadata) && Object.hasOwn(hit.metadata, c)
        ? [el("dt", {}, c), el("dd", {}, String(hit.metadata[c]))] : [])) : null,
      snippetOf(hit),
      stack(partsOfHits[i], range),
      rest.length ? el("details", {}, el("summary", {}, mode === "recipe"
        ? "cosines, not the score: the raw dense ⟨q, t̂⟩ the recipe normalises, each operator's"
        : "each operator's cosine"),
      bars(rest.map(([name, v]) => [name === "dense" ? "dense ⟨q, t̂⟩" : name, v]),
           {highlight: new Set([...chosen, "dense ⟨q, t̂⟩"])})) : null);
  }));
}

// A bundle's description of a relation is data: any field may be missing or of another type, and a
// field that is not what is expected is left out, never allowed to stop the page.
const isObject = (x) => typeof x === "object" && x !== null && !Array.isArray(x);
const own = (object, key) => (isObject(object) && Object.hasOwn(object, key) ? object[key] : undefined);
const isNumber = (x) => typeof x === "number" && Number.isFinite(x);

function metricCells(metrics) {
  if (!isObject(metrics)) return "";
  const name = typeof own(metrics, "metric") === "string" ? metrics.metric : "mrr";
  const split = typeof own(metrics, "split") === "string" ? metrics.split : "test";
  const rows = ["trained", "identity", "bm25", "hybrid"].filter((k) => isNumber(own(own(metrics, k), name)))
    .map((k) => [k === "trained" ? "operator" : k, metrics[k][name]]);
  if (!rows.length) return "";
  return el("div", {}, el("div", {class: "muted"}, `${name} on ${split}`),
    bars(rows, {signed: false, highlight: new Set(["operator"])}));
}

function wholeCorpusCells(info) {
  if (!isObject(own(info, "whole_corpus"))) return "";
  return el("div", {}, ["test", "dev"].filter((split) => isObject(own(info.whole_corpus, split))).map((split) => {
    const numbers = info.whole_corpus[split];
    const rows = ["recipe", "operator", "identity", "bm25", "hybrid"].filter((k) => isNumber(own(numbers, k)))
      .map((k) => [k, numbers[k]]);
    return el("div", {}, el("div", {class: "muted"}, `${split} MRR`), bars(rows, {signed: false,
      highlight: new Set(["recipe"])}));
  }));
}

// Where the relation scores below identity, BM25 or the hybrid (GET /relations' "losses", written by the
// server: retrieval/verdicts.py), each line a mark under its description
const lossLines = (info) => (Array.isArray(own(info, "losses")) ? info.losses.filter((x) => typeof x === "string") : []);

function lossMarks(info) {
  const lines = lossLines(info);
  return lines.length ? el("ul", {class: "losses"}, ...lines.map((line) => el("li", {}, line))) : null;
}

// The relation's figure on a dataset its recipe never saw (relsearch bench transfer), beside identity, BM25, hybrid
function transferCells(info) {
  const transfer = own(info, "transfer");
  if (!isObject(transfer)) return "";
  const rows = ["relation", "identity", "bm25", "hybrid"].filter((k) => isNumber(own(transfer, k)))
    .map((k) => [k, transfer[k]]);
  if (!rows.length) return "";
  const dataset = typeof own(transfer, "dataset") === "string" ? transfer.dataset : "transfer set";
  const metric = typeof own(transfer, "metric") === "string" ? transfer.metric : "mrr";
  const when = typeof own(transfer, "date") === "string" ? `, ${transfer.date}` : "";
  return el("div", {}, el("div", {class: "muted"}, `${dataset}: ${metric}${when}`),
    bars(rows, {signed: false, highlight: new Set(["relation"])}));
}

// What `relation NAME` runs, in words (Recipe.describe); a recipe this page cannot read stays its JSON
function recipeWords(info) {
  if (own(info, "recipe") === undefined) return null;
  const recipe = readRecipe(info.recipe);
  return el("div", {class: "recipe"}, el("span", {class: "muted"}, "runs "),
    recipe ? el("span", {class: "words"}, describe(recipe)) : el("code", {}, JSON.stringify(info.recipe)));
}

// "trained on: …" from GET /relations/sources ({trained_on, dataset}), or nothing when the bundle does not say
export function trainedOn(source) {
  if (!isObject(source) || typeof source.trained_on !== "string" || !source.trained_on) return null;
  return el("span", {class: "trained-on", title: typeof source.dataset === "string" ? source.dataset : ""},
    `trained on: ${source.trained_on}`);
}

export function relationRows(tbody, relations, sources = {}) {
  tbody.replaceChildren(...relations.map((r) => el("tr", {"data-name": r.name, class: lossLines(r).length ? "loses" : ""},
    el("td", {}, el("strong", {}, String(r.name)), trainedOn(own(sources, r.name))), el("td", {}, String(r.kind ?? "")),
    el("td", {}, typeof r.description === "string" ? r.description : "", recipeWords(r), lossMarks(r)),
    el("td", {}, metricCells(r.metrics)), el("td", {}, wholeCorpusCells(r)), el("td", {}, transferCells(r)))));
}

// The anchor card above an answer: what the hits stand in relation to. A stored document (GET /document: its
// name, id, each text, its fields folded), or the query's text; hidden for a query by examples (the query line)
export function anchorCard(box, state, doc) {
  box.hidden = !(doc || (state && state.mode === "text"));
  if (box.hidden) {
    box.replaceChildren();
    return;
  }
  const texts = doc ? Object.entries(isObject(doc.texts) ? doc.texts : {}) : [["text", state.text]];
  const shown = (v) => (typeof v === "string" ? v : JSON.stringify(v));
  const fields = doc && isObject(doc.metadata) ? Object.entries(doc.metadata) : [];
  box.replaceChildren(
    el("div", {class: "anchor-head"}, el("span", {class: "muted"}, "anchor "),
      doc ? [el("strong", {class: "anchor-name"}, String(doc.name || doc.id)), " ", el("code", {class: "anchor-id"}, String(doc.id))]
        : el("strong", {class: "anchor-name"}, "query text")),
    ...texts.map(([name, text]) => el("p", {class: "anchor-text", "data-field": name},
      texts.length > 1 ? el("span", {class: "muted"}, `${name}: `) : null, String(text))),
    fields.length ? el("details", {class: "anchor-fields"}, el("summary", {}, `${fields.length} fields`),
      el("dl", {class: "meta"}, fields.flatMap(([name, value]) => [el("dt", {}, name), el("dd", {}, shown(value))]))) : null);
}

// Where the "why not" document stands in the mixture's whole answer (POST /search's why_not: retrieval/request.py
// Plan.why_not): its rank among all the hits ranked, its score and parts; when it ranks below the last hit shown,
// that hit's score and parts beside it on the same track, and the parts it trails most on (as `relsearch query
// --why-not` prints them: the 3 largest gaps)
export function whyNotBox(box, reason, {mode = "dense", single = "score"} = {}) {
  box.hidden = !isObject(reason);
  if (box.hidden) {
    box.replaceChildren();
    return;
  }
  const scale = SCALES[mode] || SCALES.dense;
  const count = (n) => (isNumber(n) ? n.toLocaleString("en-US") : String(n));
  const head = (...words) => el("p", {class: "why-not-head", "data-id": String(reason.id), "data-of": String(reason.of)},
    el("strong", {}, `why not ${reason.id}`), ...words);
  if (!isNumber(reason.rank)) {
    box.replaceChildren(head(": ",
      `not among the ${count(reason.of)} hits this query can return (filtered out, collapsed under a better hit, `,
      "the query's own document, or past the first 10,000)"));
    return;
  }
  const cut = isObject(reason.cut) && isNumber(reason.cut.rank) ? reason.cut : null;
  const hits = cut ? [reason, cut] : [reason];
  const parts = hits.map((hit) => scoreParts(hit, mode, single));
  const range = trackRange(parts, mode);
  const scored = (hit) => [el("span", {class: "scale"}, scale.label), " ", el("span", {class: "value"}, round(hit.score, 4))];
  const card = (hit, i) => el("div", {class: "why-not-hit", "data-id": String(hit.id), "data-rank": String(hit.rank),
                                      "data-score": String(hit.score)},
    el("div", {class: "head"}, i ? `the last shown, rank ${count(hit.rank)} (${hit.id}): ` : `${hit.id}: rank ${count(hit.rank)}`,
      i ? null : ` of ${count(reason.of)}, `, ...scored(hit)),
    stack(parts[i], range));
  const labels = new Map(parts.flat().map((p) => [p.key, p.label]));
  const mine = isObject(reason.explain) ? reason.explain : {};
  const theirs = cut && isObject(cut.explain) ? cut.explain : {};
  const behind = Object.entries(mine).filter(([k, v]) => /^(recipe|mixture):/.test(k) && isNumber(v))
    .map(([k, v]) => [k, (isNumber(theirs[k]) ? theirs[k] : 0) - v]).filter(([, gap]) => gap > 0)
    .sort((a, b) => b[1] - a[1]).slice(0, 3);
  box.replaceChildren(
    head(el("span", {class: "muted"}, cut ? ` · below the ${count(cut.rank)} hits shown, beside the last of them`
      : " · among the hits shown")),
    el("div", {class: "why-not-pair"}, hits.map(card)),
    behind.length ? el("p", {class: "why-not-behind"}, "behind it on ", behind.flatMap(([k, gap], i) =>
      [i ? ", " : null, el("span", {class: "gap", "data-part": k}, `${labels.get(k) || k} by ${round(gap)}`)])) : null);
}
