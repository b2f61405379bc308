// The explorer: form ↔ URL state, side-by-side search (identity vs the chosen mixture) of a text, a stored
// document or examples (like / not like), facet counts that add a filter, highlighted query terms, score and
// relations panels; above the hits the anchor card, under each hit the link that makes it the query, the
// mixture's answer as a CSV or JSONL download, and under the hits where a chosen document ranks ("why not").
import {ApiError, call, file, get, setKey} from "./api.js";
import {FILTER_OPS, examplesBody, facetFilter, readState, rowParts, writeFilter, writeState} from "./query.js";
import {NO_HIGHLIGHTS} from "./marks.js";
import {ranWords} from "./recipe.js";
import {anchorCard, bars, el, folded, hitList, relationRows, trainedOn, whyNotBox} from "./view.js";

const $ = (id) => document.getElementById(id);
const NAME_FIELDS = ["name", "title", "company", "security"];
let fields = []; // GET /fields: [{name, types, values?}]
let bundleRelations = []; // GET /relations: [{name, kind, description, recipe?, ...}]
let retry = null; // what to run again once an API key is given
let exported = null; // the body of the mixture's last search: what the download links fetch as a file
const unfolded = new Set(); // the facets whose values past the first FACET_SHOWN someone unfolded: kept across searches
const FACET_SHOWN = 10;

// ---------------------------------------------------------------- errors, next to the field at fault

function clearErrors(scope) {
  scope.querySelectorAll(".error").forEach((box) => { box.textContent = ""; });
}

function showError(error, scope = document) {
  const field = error instanceof ApiError && error.field ? error.field.split(/[.[]/)[0] : "";
  const box = document.querySelector(`.error[data-for="${CSS.escape(field)}"]`) ||
              scope.querySelector('.error[data-for=""]') || document.querySelector('.error[data-for=""]');
  box.textContent = error.message;
  if (error.status === 401) $("key-form").hidden = false;
}

async function guarded(action, scope) {
  try {
    return await action();
  } catch (error) {
    if (error.status === 401) retry = action;
    showError(error, scope);
    return undefined;
  }
}

$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  setKey($("key").value.trim());
  $("key").value = "";
  $("key-form").hidden = true;
  clearErrors($("key-form"));
  const again = retry;
  retry = null;
  if (again) guarded(again);
});

// ---------------------------------------------------------------- the form

// A slider starts at the weight the search runs with: its range reaches that weight, and a weight off
// the 0.05 grid (0.33 from a URL) is kept as it is rather than snapped
function relationSlider(name, weight, source) {
  const onGrid = Math.abs(weight * 20 - Math.round(weight * 20)) < 1e-9;
  const range = el("input", {type: "range", min: String(Math.min(0, weight)), max: String(Math.max(1, weight)),
                             step: onGrid ? "0.05" : "any", value: String(weight), "data-relation": name,
                             "aria-label": `${name} weight`});
  const shown = el("output", {}, String(weight));
  range.addEventListener("input", () => { shown.textContent = range.value; });
  range.addEventListener("change", () => search());
  return el("label", {class: "relation"}, el("span", {class: "name"}, name, trainedOn(source)), range, shown);
}

// A relation the URL names that this index's bundle does not have: kept as written (the URL keeps it),
// named as an error, never searched, until it is removed
function unknownRelation(name, weight) {
  const remove = el("button", {type: "button", class: "remove", title: "remove this relation"}, "×");
  const known = bundleRelations.filter((r) => !("labels" in r)).map((r) => r.name).join(", ");
  const row = el("div", {class: "relation unknown", "data-unknown-relation": name, "data-weight": String(weight)},
    el("span", {class: "name"}, name), el("span", {class: "muted"}, `weight ${weight}`), remove,
    el("div", {class: "error relation-error"}, `${name} is not a relation of this index; its relations: ${known}`));
  remove.addEventListener("click", () => row.remove());
  return row;
}

function fieldTypes(name) {
  return (fields.find((f) => f.name === name) || {types: []}).types;
}

// A filter row: field, operator, value; `spec` (an expression from the URL) is kept as written until the
// row is edited, and one a row cannot show (not ..., A or B) stays an editable expression. Either way the
// server reads it (POST /filters/parse), with the CLI's grammar, and names what is wrong next to the row.
function filterRow(spec) {
  const parts = spec === undefined ? {field: fields[0] ? fields[0].name : "", op: "=", value: ""} : rowParts(spec);
  const remove = el("button", {type: "button", class: "remove", title: "remove this filter"}, "×");
  const error = el("div", {class: "error filter-error"});
  let row;
  if (!parts) {
    const expression = el("input", {class: "expr", value: spec, spellcheck: "false", "aria-label": "filter expression",
                                    title: "as `relsearch query --filter` reads it"});
    row = el("div", {class: "filter expression"}, expression, remove, error);
  } else {
    const known = fields.some((f) => f.name === parts.field);
    const field = el("select", {class: "field", "aria-label": "filter field"},
      known ? null : el("option", {value: parts.field, selected: true, class: "unknown"}, `${parts.field} (not a field here)`),
      fields.map((f) => el("option", {value: f.name, selected: f.name === parts.field}, f.name)));
    const op = el("select", {class: "op", "aria-label": "filter operator"},
      FILTER_OPS.map((o) => el("option", {value: o, selected: o === parts.op}, o)));
    const listId = `values-${Math.random().toString(36).slice(2)}`;
    const values = el("datalist", {id: listId});
    const value = el("input", {class: "value", list: listId, value: parts.value, "aria-label": "filter value"});
    const offerValues = () => values.replaceChildren(...((fields.find((f) => f.name === field.value) || {}).values || [])
      .map((v) => el("option", {value: v})));
    field.addEventListener("change", offerValues);
    offerValues();
    row = el("div", {class: "filter"}, field, op, remove, value, values, error);
    if (spec !== undefined) {
      row.dataset.spec = spec;
      for (const input of [field, op, value]) {
        for (const type of ["input", "change"]) input.addEventListener(type, () => { delete row.dataset.spec; });
      }
    }
  }
  remove.addEventListener("click", () => row.remove());
  return row;
}

function filterText(row) {
  if (row.classList.contains("expression")) return row.querySelector(".expr").value.trim();
  if (row.dataset.spec !== undefined) return row.dataset.spec; // as the URL wrote it
  const field = row.querySelector(".field").value;
  return writeFilter(field, row.querySelector(".op").value, row.querySelector(".value").value.trim(), fieldTypes(field));
}

// One example of a query by examples: like / not like, a stored document (completed as the id box is) or
// a text, and an optional weight (blank: the server's default, 1 for a like, 0.5 for an unlike)
function exampleRow(kind = "like", example = {id: ""}) {
  const byText = "text" in example;
  const polarity = el("select", {class: "polarity", "aria-label": "like or not like"},
    el("option", {value: "like", selected: kind === "like"}, "like"),
    el("option", {value: "unlike", selected: kind === "unlike"}, "not like"));
  const source = el("select", {class: "source", "aria-label": "a stored document or a text"},
    el("option", {value: "id", selected: !byText}, "document"),
    el("option", {value: "text", selected: byText}, "text"));
  const weight = el("input", {type: "number", class: "weight", min: "0", step: "any", placeholder: "auto",
                              value: example.weight === null || example.weight === undefined ? null : String(example.weight),
                              "aria-label": "example weight", title: "weight (blank: 1 for like, 0.5 for not like)"});
  const value = el("input", {class: "example-value", value: byText ? example.text : example.id, spellcheck: "false",
                             "aria-label": "example"});
  const remove = el("button", {type: "button", class: "remove", title: "remove this example"}, "×");
  const row = el("div", {class: `example ${kind}`, "data-kind": kind}, polarity, source, weight, remove, value);
  const showSource = () => {
    if (source.value === "id") value.setAttribute("list", "id-options");
    else value.removeAttribute("list");
    value.placeholder = source.value === "id" ? "id or name, e.g. MSFT" : "a text, e.g. cloud software";
  };
  showSource();
  source.addEventListener("change", showSource);
  polarity.addEventListener("change", () => {
    row.dataset.kind = polarity.value;
    row.className = `example ${polarity.value}`;
  });
  completeIds(value, () => source.value === "id");
  remove.addEventListener("click", () => row.remove());
  return row;
}

function readExamples() {
  const examples = {like: [], unlike: []};
  for (const row of document.querySelectorAll("#examples .example")) {
    const value = row.querySelector(".example-value").value.trim();
    if (!value) continue; // a blank row is not an example
    const weight = row.querySelector(".weight").value.trim();
    examples[row.dataset.kind].push({[row.querySelector(".source").value]: value,
                                     weight: weight === "" ? null : Number(weight)});
  }
  return examples;
}

function readForm() {
  const relations = Object.create(null); // keyed by relation names: no inherited keys
  for (const range of document.querySelectorAll("[data-relation]")) {
    if (Number(range.value) !== 0) relations[range.dataset.relation] = Number(range.value);
  }
  for (const row of document.querySelectorAll("[data-unknown-relation]")) {
    relations[row.dataset.unknownRelation] = Number(row.dataset.weight);
  }
  const filters = [...document.querySelectorAll(".filter")].map(filterText);
  const {like, unlike} = readExamples();
  return {
    index: $("index").value,
    mode: document.querySelector('input[name="mode"]:checked').value,
    text: $("text").value,
    id: $("doc-id").value.trim(),
    like,
    unlike,
    relations,
    filters,
    facets: [...document.querySelectorAll("[data-facet]:checked")].map((box) => box.dataset.facet),
    facetDepth: Number($("facet-depth").value) || null,
    k: Number($("k").value) || 10,
    hybrid: $("hybrid").value,
    field: $("text-field").value,
    columns: [...document.querySelectorAll("[data-column]:checked")].map((box) => box.dataset.column),
    whyNot: $("why-not").value.trim(),
  };
}

function showMode(mode) {
  document.querySelector(`input[name="mode"][value="${mode}"]`).checked = true;
  $("text").hidden = mode !== "text";
  $("doc-id").hidden = mode !== "id";
  $("examples-box").hidden = mode !== "like";
  if (mode === "like" && !$("examples").children.length) { // start from the document being looked at
    $("examples").append(exampleRow("like", {id: $("doc-id").value.trim()}));
  }
}

// The sliders start where the search is: the URL's relations, or identity at 1 when it names none
function fillForm(state, operators, sources) {
  $("examples").replaceChildren(...state.like.map((e) => exampleRow("like", e)),
                                ...state.unlike.map((e) => exampleRow("unlike", e)));
  showMode(state.mode);
  $("text").value = state.text;
  $("doc-id").value = state.id;
  $("k").value = String(state.k);
  $("hybrid").value = state.hybrid;
  $("text-field").value = state.field;
  $("why-not").value = state.whyNot;
  const chosen = Object.keys(state.relations).length ? state.relations : {identity: 1};
  const names = new Set(operators.map((r) => r.name));
  $("relations").replaceChildren(
    ...operators.map((r) => relationSlider(r.name, Object.hasOwn(chosen, r.name) ? chosen[r.name] : 0,
                                           Object.hasOwn(sources, r.name) ? sources[r.name] : null)),
    ...Object.entries(chosen).filter(([name]) => !names.has(name)).map(([name, w]) => unknownRelation(name, w)));
  $("filters").replaceChildren(...state.filters.map((spec) => filterRow(spec)));
  clearErrors($("search-form"));
  const nameField = NAME_FIELDS.find((n) => fields.some((f) => f.name === n));
  const shown = new Set(state.columns || (nameField ? [nameField] : []));
  const scalar = fields.filter((f) => !f.types.every((t) => t === "array" || t === "object"));
  $("columns").replaceChildren(...scalar
    .map((f) => el("label", {}, el("input", {type: "checkbox", "data-column": f.name, checked: shown.has(f.name)}), f.name)));
  // facet fields: the index's, and any other the URL names (kept, so that the server says what is wrong)
  const counted = new Set(state.facets);
  const facetBox = (name, known) => {
    const box = el("input", {type: "checkbox", "data-facet": name, checked: counted.has(name)});
    box.addEventListener("change", () => { if ($("mixture-hits").childElementCount) search(); });
    return el("label", known ? {} : {class: "unknown"}, box, known ? name : `${name} (not a field here)`);
  };
  $("facet-fields").replaceChildren(...scalar.map((f) => facetBox(f.name, true)),
    ...state.facets.filter((name) => !scalar.some((f) => f.name === name)).map((name) => facetBox(name, false)));
  $("facet-depth").value = state.facetDepth ? String(state.facetDepth) : "";
}

// ---------------------------------------------------------------- searching

// no answer to download, and no anchor above hits that are not its answer
function clearAnswer() {
  exported = null;
  $("downloads").hidden = true;
  anchorCard($("anchor"), null, null);
  whyNotBox($("why-not-box"), null);
}

function clearHits() {
  clearAnswer();
  $("identity-hits").replaceChildren();
  $("mixture-hits").replaceChildren();
  $("mixture-name").textContent = "";
  $("mixture-recipe").textContent = "";
  $("facets").replaceChildren();
}

// ---------------------------------------------------------------- examples, facets, highlights

// What a query by examples asks, above the hits: like A, B ×0.5, not like C
function showQuery(state) {
  const line = $("query-line");
  line.hidden = state.mode !== "like";
  if (line.hidden) {
    line.replaceChildren();
    return;
  }
  const named = (e, kind) => {
    const words = "id" in e ? e.id : `“${e.text.length > 60 ? `${e.text.slice(0, 60)}…` : e.text}”`;
    return el("span", {class: `ex ${kind}`, "data-kind": kind, "data-example": "id" in e ? e.id : e.text},
      words, e.weight === null || e.weight === 1 ? null : el("span", {class: "weight"}, ` ×${e.weight}`));
  };
  const list = (examples, kind) => examples.flatMap((e, i) => [i ? ", " : null, named(e, kind)]).filter(Boolean);
  line.replaceChildren(el("strong", {}, "documents like "), ...list(state.like, "like"),
    ...(state.unlike.length ? [el("strong", {}, " and not like "), ...list(state.unlike, "unlike")] : []),
    el("span", {class: "muted"}, " · the examples themselves are left out of the hits"));
}

// The answer's facet counts, per field, each a button that adds its filter (field = value) and searches again;
// a field's first FACET_SHOWN values (the most frequent: the server sends them in order) and "more (N)" for the rest
function showFacets(counts, state) {
  const active = new Set(state.filters.map((spec) => spec.trim()));
  const button = (field, value, count) => {
    const spec = facetFilter(field, value);
    const label = value === null ? "null" : typeof value === "string" ? value : JSON.stringify(value);
    const b = el("button", {type: "button", class: `facet-value${spec !== null && active.has(spec) ? " active" : ""}`,
                            "data-value": JSON.stringify(value), "data-filter": spec, disabled: spec === null,
                            title: spec === null ? "no filter expression says this value"
                              : `${active.has(spec) ? "filtered: " : "add the filter "}${spec}${value === null
                                ? " (missing or null)" : ""}${active.has(spec) ? "" : " and search again"}`},
      el("span", {class: "value"}, label), " ", el("span", {class: "count"}, String(count)));
    if (spec !== null) b.addEventListener("click", () => addFilter(field, spec));
    return b;
  };
  const depth = state.facetDepth || 100;
  const fieldRows = Object.entries(counts && typeof counts === "object" ? counts : {}).filter(([, rows]) => Array.isArray(rows));
  const note = el("div", {class: "muted facet-note"}, `values of the mixture's first ${depth} hits under the filters, ` +
    "most frequent first; click one to filter on it");
  $("facets").replaceChildren(...(fieldRows.length ? [note] : []), ...fieldRows.map(([field, rows]) => {
    const valid = rows.filter((r) => Array.isArray(r) && r.length === 2);
    return el("div", {class: "facet", "data-field": field},
      el("span", {class: "facet-name", title: `over the mixture's first ${depth} hits under the filters`}, field),
      valid.length ? folded(valid.map(([value, count]) => button(field, value, count)), {
        shown: FACET_SHOWN, open: unfolded.has(field), what: `values of ${field}`,
        onToggle: (open) => (open ? unfolded.add(field) : unfolded.delete(field))})
        : el("span", {class: "muted"}, `no value in the first ${depth} hits`));
  }));
}

// A facet's filter: added as a row (one already equal to it is not doubled; an equality on the same field,
// which could only contradict it, is replaced), then the search runs again
function addFilter(field, spec) {
  const rows = [...document.querySelectorAll("#filters .filter")];
  if (!rows.some((row) => filterText(row).trim() === spec)) {
    const same = rows.find((row) => {
      const parts = rowParts(filterText(row));
      return parts && parts.field === field && (parts.op === "=" || parts.op === "is null");
    });
    if (same) same.replaceWith(filterRow(spec));
    else $("filters").append(filterRow(spec));
  }
  search();
}

// The answers' warnings, each once: filter values that can never match, parts of a relation's recipe
// that cannot apply to this query (a bonus on a missing field, bonuses on a text query), ... but not that a
// search without a BM25 part has no highlights: the page asks every search for them, the user did not
function showWarnings(answers, box = $("warnings")) {
  const said = [...new Set(answers.flatMap((a) => (Array.isArray(a.warnings) ? a.warnings : [])))]
    .filter((w) => !String(w).startsWith(NO_HIGHLIGHTS));
  box.replaceChildren(...said.map((w) => el("li", {}, String(w))));
}

// The filter expressions in the API's JSON form, read by the server as the CLI reads them; null (and
// each message next to its row, no hits shown) when one cannot be read or names no field of the index
async function readFilters(state, form) {
  if (!state.filters.length) return {};
  let answer;
  try {
    answer = await call("/filters/parse", {index: state.index, filters: state.filters});
  } catch (error) {
    if (error.status === 401) retry = () => search({push: false});
    showError(error, form);
    return null;
  }
  const rows = document.querySelectorAll("#filters .filter");
  for (const {field, message} of answer.errors) {
    const at = /^filters\[(\d+)\]$/.exec(field || "");
    const box = at && rows[Number(at[1])] ? rows[Number(at[1])].querySelector(".filter-error")
                                          : form.querySelector('.error[data-for="filters"]');
    box.textContent = message;
  }
  return answer.errors.length ? null : answer.filters;
}

async function search({push = true} = {}) {
  const form = $("search-form");
  const state = readForm();
  clearErrors(form);
  $("warnings").replaceChildren();
  const url = writeState(state);
  if (push && url !== location.search) history.pushState(null, "", url);
  const unknown = [...document.querySelectorAll("[data-unknown-relation]")].map((row) => row.dataset.unknownRelation);
  for (const row of document.querySelectorAll("[data-unknown-relation]")) {
    row.querySelector(".relation-error").textContent = `${row.dataset.unknownRelation} is not a relation of this ` +
      `index; its relations: ${bundleRelations.filter((r) => !("labels" in r)).map((r) => r.name).join(", ")}`;
  }
  const filters = await readFilters(state, form);
  if (filters === null || unknown.length) {
    clearHits();
    const why = [filters === null ? "a filter could not be read" : "",
                 unknown.length ? `${unknown.join(", ")}: not a relation of this index` : ""].filter(Boolean);
    $("status").textContent = `Not searched: ${why.join("; ")} (see the message next to it).`;
    return;
  }
  const mixture = Object.keys(state.relations).length ? state.relations : {identity: 1};
  const query = state.mode !== "like" ? {[state.mode]: state[state.mode]}
    : {like: examplesBody(state.like), ...(state.unlike.length ? {unlike: examplesBody(state.unlike)} : {})};
  const base = {index: state.index, k: state.k, filters, explain: true, ...query};
  if (state.hybrid) base.hybrid = state.hybrid;
  if (state.field) base.field = state.field;
  const counted = state.facets.length ? {facets: state.facets, ...(state.facetDepth ? {facet_depth: state.facetDepth} : {})} : {};
  const whyNot = state.whyNot ? {why_not: state.whyNot} : {}; // asked of the mixture: the answer shown beside it
  showQuery(state);
  whyNotBox($("why-not-box"), null);
  $("facets").replaceChildren();
  $("results").classList.add("loading");
  $("results").setAttribute("aria-busy", "true");
  $("search").disabled = true;
  $("status").textContent = "searching…";
  // highlights are asked of both searches: a search with a BM25 part (the server's plan decides) carries them
  const answer = await guarded(() => Promise.all([
    call("/search", {...base, relations: {identity: 1}, highlight: true}),
    call("/search", {...base, relations: mixture, highlight: true, ...counted, ...whyNot}),
    state.mode === "id" ? get("/document", {index: state.index, id: state.id}) : null]), form);
  $("results").classList.remove("loading");
  $("results").removeAttribute("aria-busy");
  $("search").disabled = false;
  if (!answer) {
    clearAnswer();
    $("status").textContent = "The search failed: see the message next to the field.";
    return;
  }
  const [plain, mixed, anchor] = answer;
  anchorCard($("anchor"), state, anchor ? anchor.document : null);
  exported = {...base, relations: mixture};
  $("downloads").hidden = false;
  // each hit links to the same search from it: relations, filters, k and the rest kept, the hit as the stored document
  const next = (hit) => writeState({...state, mode: "id", id: hit.id, like: [], unlike: []});
  const before = new Map(plain.results.map((hit) => [hit.id, hit.rank]));
  const kept = new Set(mixed.results.map((hit) => hit.id));
  // each answer says what its query plan ran (mode: the scale its scores are on; the combined recipe)
  hitList($("identity-hits"), plain.results, {columns: state.columns, kept, mode: plain.mode, next,
                                              single: "identity", chosen: new Set(["identity"])});
  const names = Object.keys(mixture);
  const single = names.length === 1 ? names[0] : "score"; // what a score of one part is called
  hitList($("mixture-hits"), mixed.results, {columns: state.columns, before, mode: mixed.mode, next, single,
                                             chosen: new Set([...names, ...Object.keys(mixed.recipe?.mixture || {})])});
  $("mixture-name").textContent = Object.entries(mixture).map(([name, w]) => `${name} ${w}`).join(" + ");
  $("mixture-recipe").textContent = ranWords(mixed);
  showWarnings([plain, mixed]);
  showFacets(mixed.facets, state);
  whyNotBox($("why-not-box"), mixed.why_not, {mode: mixed.mode, single});
  const moved = mixed.results.filter((hit) => before.get(hit.id) !== hit.rank).length;
  $("status").textContent = `${mixed.results.length} hits · ${moved} ranked differently from identity · ` +
                            `generation ${mixed.generation}`;
}

// A hit's "→ query" link: the page moves to its URL (a new history entry, so Back returns) and searches it;
// a click that asks for a new tab or window is the browser's
$("results").addEventListener("click", (event) => {
  const link = event.target.closest("a.next-query");
  if (!link || event.button !== 0 || event.ctrlKey || event.metaKey || event.shiftKey || event.altKey) return;
  event.preventDefault();
  history.pushState(null, "", link.getAttribute("href"));
  openIndex(readState(location.search));
});

// The mixture's answer as a file: the same search again with format=csv|jsonl (the API's rows, not a copy made
// here), saved under the link's download name
for (const link of document.querySelectorAll("#downloads a[data-format]")) {
  link.addEventListener("click", async (event) => {
    event.preventDefault();
    if (!exported) return;
    const body = exported;
    const blob = await guarded(() => file(link.getAttribute("href"), body)); // POST /search?format=csv|jsonl
    if (!blob) return;
    const url = URL.createObjectURL(blob);
    const save = el("a", {href: url, download: link.getAttribute("download"), hidden: true});
    document.body.append(save);
    save.click();
    save.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60_000);
  });
}

// ---------------------------------------------------------------- completion of stored document ids

// the id box and each example's document box share one list of choices (#id-options)
let completing = null;
function completeIds(input, active = () => true) {
  input.addEventListener("input", () => {
    clearTimeout(completing);
    const prefix = input.value.trim();
    if (!prefix || !active()) return;
    completing = setTimeout(async () => {
      const answer = await guarded(() => get("/complete", {index: $("index").value, prefix, limit: 10}));
      if (answer) {
        $("id-options").replaceChildren(...answer.matches.map((m) => el("option", {value: m.id, label: m.name || m.id})));
      }
    }, 150);
  });
}
completeIds($("doc-id"));
completeIds($("why-not"));

// ---------------------------------------------------------------- score and relations panels

$("score-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const panel = $("score-panel");
  clearErrors(panel);
  $("scores").replaceChildren(el("p", {class: "muted"}, "scoring…"));
  $("score-warnings").replaceChildren();
  const answer = await guarded(() => call("/score", {index: $("index").value, a: $("score-a").value,
                                                      b: $("score-b").value}), panel);
  $("scores").replaceChildren();
  if (answer) {
    showWarnings([answer], $("score-warnings"));
    const sorted = Object.entries(answer.scores).sort((x, y) => y[1] - x[1]);
    $("scores").replaceChildren(bars(sorted));
  }
});

// ---------------------------------------------------------------- start: indexes, then the index's relations and fields

// An index of several named texts: a selector of one of them (the URL's kept even if unknown: the server names
// the index's fields); hidden for an index of one text
function textFields(names, chosen) {
  const known = names.length > 1 ? names : [];
  const extra = chosen && !known.includes(chosen) ? [chosen] : [];
  $("text-field").replaceChildren(el("option", {value: ""}, "all, each hit by its best"),
    ...[...known, ...extra].map((name) => el("option", {value: name, selected: name === chosen}, name)));
  $("text-field-box").hidden = !known.length && !extra.length;
}

async function openIndex(state) {
  $("status").textContent = "loading the index's relations and fields…";
  const answer = await guarded(async () => {
    const [rels, described, trained] = await Promise.all([get("/relations", {index: state.index}),
                                                          get("/fields", {index: state.index}),
                                                          // advice only: the page opens without it
                                                          get("/relations/sources", {index: state.index}).catch(() => null)]);
    fields = described.fields;
    textFields(described.texts || [], state.field);
    bundleRelations = rels.relations;
    const sources = trained && typeof trained.relations === "object" && trained.relations ? trained.relations : {};
    const operators = rels.relations.filter((r) => !("labels" in r)); // re-ranking heads carry labels
    relationRows(document.querySelector("#relation-table tbody"), rels.relations, sources);
    fillForm(state, operators, sources);
    $("status").textContent = "Type a text or pick a document, choose relations, then search.";
    if (state.text.trim() || state.id || state.like.length || state.unlike.length) await search({push: false}); // a shared URL shows its results at once
    return true;
  });
  if (!answer) $("status").textContent = "The index could not be opened: see the message above.";
}

async function start() {
  const state = readState(location.search);
  const health = await guarded(() => get("/health"));
  if (!health) return;
  const names = Object.keys(health.indexes);
  $("index").replaceChildren(...names.map((n) => el("option", {value: n}, n)));
  $("index").disabled = names.length < 2;
  state.index = names.includes(state.index) ? state.index : names[0];
  $("index").value = state.index;
  $("index-info").textContent = `${health.indexes[state.index].documents} documents`;
  await openIndex(state);
}

document.querySelectorAll('input[name="mode"]').forEach((radio) => radio.addEventListener("change", () => showMode(radio.value)));
$("add-filter").addEventListener("click", () => $("filters").append(filterRow()));
$("add-like").addEventListener("click", () => $("examples").append(exampleRow("like")));
$("add-unlike").addEventListener("click", () => $("examples").append(exampleRow("unlike")));
$("search-form").addEventListener("submit", (event) => { event.preventDefault(); search(); });
$("index").addEventListener("change", () => openIndex({...readForm(), filters: [], index: $("index").value}));
window.addEventListener("popstate", () => openIndex(readState(location.search)));
start();
