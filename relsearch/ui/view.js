// Drawing: hits with rank movement and explain bars, bar charts, relation rows. Text goes in as text nodes only.

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (name === "class") node.className = value;
    else if (value !== undefined && value !== null && value !== false) node.setAttribute(name, value);
  }
  node.append(...children.flat().filter((c) => c !== null && c !== undefined));
  return node;
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

function movement(rank, before) {
  if (before === undefined) return el("span", {class: "move new", title: "not in identity's top k"}, "new");
  const delta = before - rank;
  if (delta === 0) return el("span", {class: "move same", title: "same rank as identity"}, "=");
  return el("span", {class: `move ${delta > 0 ? "up" : "down"}`, title: `rank ${before} under identity`},
    `${delta > 0 ? "↑" : "↓"}${Math.abs(delta)}`);
}

// before: id → rank under identity (the mixture list shows movement); kept: ids the mixture kept (identity list)
export function hitList(list, hits, {columns, before = null, kept = null, chosen = new Set()}) {
  list.replaceChildren(...hits.map((hit) => {
    const explain = Object.entries(hit.explain || {});
    const mine = explain.filter(([name]) => chosen.has(name));
    const rest = explain.filter(([name]) => !chosen.has(name));
    return el("li", {class: `hit${kept && !kept.has(hit.id) ? " dropped" : ""}`, "data-id": hit.id},
      el("div", {class: "head"},
        el("span", {class: "rank"}, `${hit.rank}.`),
        before ? movement(hit.rank, before.get(hit.id)) : null,
        el("strong", {class: "id"}, hit.id),
        el("span", {class: "score", title: "score"}, round(hit.score, 4))),
      columns.length ? el("dl", {class: "meta"}, columns.flatMap((c) => isObject(hit.metadata) && Object.hasOwn(hit.metadata, c)
        ? [el("dt", {}, c), el("dd", {}, String(hit.metadata[c]))] : [])) : null,
      el("p", {class: "snippet"}, hit.text.length > 220 ? `${hit.text.slice(0, 220)}…` : hit.text),
      mine.length ? bars(mine, {highlight: chosen}) : null,
      rest.length ? el("details", {}, el("summary", {}, "every operator"), bars(rest)) : null);
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
  const parts = ["test", "dev"].filter((split) => isObject(own(info.whole_corpus, split))).map((split) => {
    const numbers = info.whole_corpus[split];
    const rows = ["recipe", "operator", "identity", "bm25", "hybrid"].filter((k) => isNumber(own(numbers, k)))
      .map((k) => [k, numbers[k]]);
    return el("div", {}, el("div", {class: "muted"}, `${split} MRR`), bars(rows, {signed: false,
      highlight: new Set(["recipe"])}));
  });
  const recipe = info.recipe ? el("code", {class: "recipe"}, JSON.stringify(info.recipe)) : null;
  return el("div", {}, recipe, parts);
}

export function relationRows(tbody, relations) {
  tbody.replaceChildren(...relations.map((r) => el("tr", {"data-name": r.name},
    el("td", {}, el("strong", {}, String(r.name))), el("td", {}, String(r.kind ?? "")),
    el("td", {}, typeof r.description === "string" ? r.description : ""),
    el("td", {}, metricCells(r.metrics)), el("td", {}, wholeCorpusCells(r)))));
}
