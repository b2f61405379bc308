// The explorer: form ↔ URL state, side-by-side search (identity vs the chosen mixture), score and relations panels.
import {ApiError, call, get, setKey} from "./api.js";
import {FILTER_OPS, readState, rowParts, writeFilter, writeState} from "./query.js";
import {describe, plan} from "./recipe.js";
import {bars, el, hitList, relationRows, trainedOn} from "./view.js";

const $ = (id) => document.getElementById(id);
const NAME_FIELDS = ["name", "title", "company", "security"];
let fields = []; // GET /fields: [{name, types, values?}]
let bundleRelations = []; // GET /relations: [{name, kind, description, recipe?, ...}]
let retry = null; // what to run again once an API key is given

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

function readForm() {
  const relations = Object.create(null); // keyed by relation names: no inherited keys
  for (const range of document.querySelectorAll("[data-relation]")) {
    if (Number(range.value) !== 0) relations[range.dataset.relation] = Number(range.value);
  }
  for (const row of document.querySelectorAll("[data-unknown-relation]")) {
    relations[row.dataset.unknownRelation] = Number(row.dataset.weight);
  }
  const filters = [...document.querySelectorAll(".filter")].map(filterText);
  return {
    index: $("index").value,
    mode: document.querySelector('input[name="mode"]:checked').value,
    text: $("text").value,
    id: $("doc-id").value.trim(),
    relations,
    filters,
    k: Number($("k").value) || 10,
    hybrid: $("hybrid").value,
    columns: [...document.querySelectorAll("[data-column]:checked")].map((box) => box.dataset.column),
  };
}

function showMode(mode) {
  document.querySelector(`input[name="mode"][value="${mode}"]`).checked = true;
  $("text").hidden = mode !== "text";
  $("doc-id").hidden = mode !== "id";
}

// The sliders start where the search is: the URL's relations, or identity at 1 when it names none
function fillForm(state, operators, sources) {
  showMode(state.mode);
  $("text").value = state.text;
  $("doc-id").value = state.id;
  $("k").value = String(state.k);
  $("hybrid").value = state.hybrid;
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
  $("columns").replaceChildren(...fields.filter((f) => !f.types.every((t) => t === "array" || t === "object"))
    .map((f) => el("label", {}, el("input", {type: "checkbox", "data-column": f.name, checked: shown.has(f.name)}), f.name)));
}

// ---------------------------------------------------------------- searching

function clearHits() {
  $("identity-hits").replaceChildren();
  $("mixture-hits").replaceChildren();
  $("mixture-name").textContent = "";
  $("mixture-recipe").textContent = "";
}

// The answers' warnings, each once: filter values that can never match, parts of a relation's recipe
// that cannot apply to this query (a bonus on a missing field, bonuses on a text query), ...
function showWarnings(answers, box = $("warnings")) {
  const said = [...new Set(answers.flatMap((a) => (Array.isArray(a.warnings) ? a.warnings : [])))];
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
  const base = {index: state.index, k: state.k, filters, explain: true, [state.mode]: state[state.mode]};
  if (state.hybrid) base.hybrid = state.hybrid;
  $("results").classList.add("loading");
  $("results").setAttribute("aria-busy", "true");
  $("search").disabled = true;
  $("status").textContent = "searching…";
  const answer = await guarded(() => Promise.all([call("/search", {...base, relations: {identity: 1}}),
                                                  call("/search", {...base, relations: mixture})]), form);
  $("results").classList.remove("loading");
  $("results").removeAttribute("aria-busy");
  $("search").disabled = false;
  if (!answer) {
    $("status").textContent = "The search failed: see the message next to the field.";
    return;
  }
  const [plain, mixed] = answer;
  const before = new Map(plain.results.map((hit) => [hit.id, hit.rank]));
  const kept = new Set(mixed.results.map((hit) => hit.id));
  const identity = plan(bundleRelations, {identity: 1}, state.hybrid) || {mode: "dense"};
  hitList($("identity-hits"), plain.results, {columns: state.columns, kept, mode: modeOf(identity, plain),
                                              single: "identity", chosen: new Set(["identity"])});
  const planned = plan(bundleRelations, mixture, state.hybrid) || {mode: "dense", recipe: null};
  const names = Object.keys(mixture);
  hitList($("mixture-hits"), mixed.results, {columns: state.columns, before, mode: modeOf(planned, mixed),
                                             single: names.length === 1 ? names[0] : "score",
                                             chosen: new Set([...names, ...Object.keys(planned.recipe?.mixture || {})])});
  $("mixture-name").textContent = Object.entries(mixture).map(([name, w]) => `${name} ${w}`).join(" + ");
  $("mixture-recipe").textContent = planned.recipe && planned.mode !== "projection"
    ? `runs ${planned.mode === "rrf" ? "rrf(dense, bm25) of " : ""}${describe(planned.recipe)}` : "";
  showWarnings([plain, mixed]);
  const moved = mixed.results.filter((hit) => before.get(hit.id) !== hit.rank).length;
  $("status").textContent = `${mixed.results.length} hits · ${moved} ranked differently from identity · ` +
                            `generation ${mixed.generation}`;
}

// The mode whose scale labels an answer's scores: the plan's, unless the answer's parts say it ran a recipe
function modeOf(planned, answer) {
  const recipeParts = answer.results.some((hit) => hit.explain && Object.keys(hit.explain).some((k) => k.startsWith("recipe:")));
  return recipeParts && planned.mode !== "rrf" ? "recipe" : planned.mode;
}

// ---------------------------------------------------------------- completion of stored document ids

let completing = null;
$("doc-id").addEventListener("input", () => {
  clearTimeout(completing);
  const prefix = $("doc-id").value.trim();
  if (!prefix) return;
  completing = setTimeout(async () => {
    const answer = await guarded(() => get("/complete", {index: $("index").value, prefix, limit: 10}));
    if (answer) {
      $("id-options").replaceChildren(...answer.matches.map((m) => el("option", {value: m.id, label: m.name || m.id})));
    }
  }, 150);
});

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

async function openIndex(state) {
  $("status").textContent = "loading the index's relations and fields…";
  const answer = await guarded(async () => {
    const [rels, described, trained] = await Promise.all([get("/relations", {index: state.index}),
                                                          get("/fields", {index: state.index}),
                                                          // advice only: the page opens without it
                                                          get("/relations/sources", {index: state.index}).catch(() => null)]);
    fields = described.fields;
    bundleRelations = rels.relations;
    const sources = trained && typeof trained.relations === "object" && trained.relations ? trained.relations : {};
    const operators = rels.relations.filter((r) => !("labels" in r)); // re-ranking heads carry labels
    relationRows(document.querySelector("#relation-table tbody"), rels.relations, sources);
    fillForm(state, operators, sources);
    $("status").textContent = "Type a text or pick a document, choose relations, then search.";
    if (state.text.trim() || state.id) await search({push: false}); // a shared URL shows its results at once
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
$("search-form").addEventListener("submit", (event) => { event.preventDefault(); search(); });
$("index").addEventListener("change", () => openIndex({...readForm(), filters: [], index: $("index").value}));
window.addEventListener("popstate", () => openIndex(readState(location.search)));
start();
