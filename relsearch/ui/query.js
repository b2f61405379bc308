// The page's state and its URL (?id=MSFT&relation=similar-company:0.7&filter=gics_sector=Energy&k=10; a query
// by examples: ?like=MSFT&like=ORCL:0.5&unlike=IBM&like_text=cloud+software; facet=gics_sector&facet_depth=100;
// why_not=GS),
// and filter expressions in `relsearch query --filter` syntax. What a filter means is decided by the
// server (POST /filters/parse runs the CLI's own parser); here an expression is only split into the
// field / operator / value of a filter row, when a row can show it exactly.

export const FILTER_OPS = ["=", "!=", "~=", ">", ">=", "<", "<=", "in", "has", "exists", "is null", "is not null"];
const NO_VALUE = new Set(["exists", "is null", "is not null"]);
const WORDS = /^([^\s=!<>~]+)\s+(?:(in|has)\s+(.*\S)|(exists|is null|is not null))\s*$/s;
// the field runs to the first operator character (trimmed after): linear time on any text
const COMPARISON = /^([^=!<>~]+)(!=|~=|>=|<=|=|>|<)(.*)$/s;

// Example and relation specs: NAME or NAME:WEIGHT, the weight after the last colon when it is a number
// (an id or text that would read as weighted is written with its weight: "a:1" as "a:1:1")
const NUMBER = /^[+-]?(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?$/i;

// One `like` / `unlike` / `like_text` / `unlike_text` value → {id | text, weight} (weight null: not given)
export function readExample(spec, key = "id") {
  const cut = spec.lastIndexOf(":");
  const weighted = cut > 0 && NUMBER.test(spec.slice(cut + 1));
  return {[key]: weighted ? spec.slice(0, cut) : spec, weight: weighted ? Number(spec.slice(cut + 1)) : null};
}

export function writeExample(example) {
  const value = "id" in example ? example.id : example.text;
  const weight = example.weight === null || example.weight === undefined ? null : example.weight;
  const misread = readExample(value).weight !== null;
  if (weight === null) return misread ? `${value}:1` : value;
  return weight === 1 && !misread ? value : `${value}:${weight}`;
}

// The examples of a state as the API takes them: [{"id": ...} | {"text": ...}, "weight"?]
export function examplesBody(examples) {
  return examples.map((e) => ({..."id" in e ? {id: e.id} : {text: e.text},
                               ...(e.weight === null || e.weight === undefined ? {} : {weight: e.weight})}));
}

export function readState(search) {
  const params = new URLSearchParams(search);
  const examples = (key) => [...params.getAll(key).map((s) => readExample(s, "id")),
                             ...params.getAll(`${key}_text`).map((s) => readExample(s, "text"))];
  const like = examples("like");
  const unlike = examples("unlike");
  const relations = Object.create(null); // keyed by names from the URL: "__proto__" is a name like any other
  for (const spec of params.getAll("relation")) {
    const cut = spec.lastIndexOf(":");
    const weight = cut > 0 ? Number(spec.slice(cut + 1)) : NaN;
    if (Number.isFinite(weight)) relations[spec.slice(0, cut)] = weight;
    else relations[spec] = 1; // a relation alone runs its stored recipe, as `--relation R` does
  }
  return {
    index: params.get("index") || "",
    mode: like.length || unlike.length ? "like" : params.has("id") ? "id" : "text",
    text: params.get("text") || "",
    id: params.get("id") || "",
    like,
    unlike,
    relations,
    filters: params.getAll("filter"),
    facets: params.getAll("facet"),
    facetDepth: Number(params.get("facet_depth")) || null,
    k: Number(params.get("k")) || 10,
    hybrid: params.get("hybrid") || "",
    field: params.get("field") || "", // one named text of an index of several ("": all, fused)
    columns: params.has("cols") ? params.get("cols").split(",").filter(Boolean) : null,
    whyNot: params.get("why_not") || "", // a stored document whose rank in the mixture's whole answer is shown
  };
}

export function writeState(state) {
  const params = new URLSearchParams();
  if (state.index) params.set("index", state.index);
  if (state.mode === "like") {
    for (const key of ["like", "unlike"]) {
      for (const e of state[key]) if ("id" in e) params.append(key, writeExample(e));
      for (const e of state[key]) if (!("id" in e)) params.append(`${key}_text`, writeExample(e));
    }
  } else if (state.mode === "id") params.set("id", state.id);
  else params.set("text", state.text);
  for (const [name, weight] of Object.entries(state.relations)) params.append("relation", `${name}:${weight}`);
  for (const spec of state.filters) params.append("filter", spec);
  params.set("k", String(state.k));
  if (state.hybrid) params.set("hybrid", state.hybrid);
  if (state.field) params.set("field", state.field);
  for (const field of state.facets || []) params.append("facet", field);
  if (state.facetDepth) params.set("facet_depth", String(state.facetDepth));
  if (state.columns) params.set("cols", state.columns.join(","));
  if (state.whyNot) params.set("why_not", state.whyNot);
  return `?${params}`;
}

// --filter's typing: a JSON number, true/false or a "quoted string"; any other text is that text
export function filterValue(text) {
  try {
    const value = JSON.parse(text);
    if (["string", "boolean"].includes(typeof value) || (typeof value === "number" && Number.isFinite(value))) {
      return value;
    }
  } catch { /* plain text */ }
  return text;
}

export function parseFilter(spec) {
  const text = spec.trim();
  let m = text.match(WORDS);
  if (m) return {field: m[1], op: m[2] || m[4], value: m[3] || ""};
  m = text.match(COMPARISON);
  if (m && m[1].trim() && !/^[=<>!~]/.test(m[3].trimStart())) {
    return {field: m[1].trim(), op: m[2], value: m[3].trim()};
  }
  throw new Error(`cannot read filter "${spec}": expected FIELD=VALUE, FIELD!=VALUE, FIELD>=VALUE (>, <, <=), ` +
                  "FIELD~=TEXT, FIELD in [A,B], FIELD has VALUE, FIELD exists or FIELD is [not] null");
}

// `and` / `or` (any case) after a space, as a whole word: the CLI's grammar joins expressions there
const JOINS = /\s(?:and|or)(?=$|[\s"[\]{},=!<>~])/i;

// True when `spec` joins expressions with `and` / `or` outside double quotes (a backslash escapes in them)
function joinsExpressions(spec) {
  const unquoted = spec.replace(/"(?:[^"\\]|\\.)*"?/gs, '""');
  return JOINS.test(unquoted);
}

// True when a text value, written bare, would read as more than itself: a joining word, or an operator
// after a space (`a b=c` reads as two expressions)
function readsAsMore(value) {
  return JOINS.test(value) || /\s\S*[=<>]/.test(value);
}

// {field, op, value} of a filter row that shows `spec` exactly, or null when a row cannot (a negation
// "not ...", alternatives "A or B", text this splitter does not read): that one stays as written
export function rowParts(spec) {
  if (/^\s*not\s/i.test(spec) || joinsExpressions(spec)) return null;
  try {
    return parseFilter(spec);
  } catch {
    return null;
  }
}

// One filter row → its expression; values stay strings in a field that holds only strings
export function writeFilter(field, op, value, types = []) {
  if (NO_VALUE.has(op)) return `${field} ${op}`;
  const textOnly = types.includes("text") && !types.includes("number") && !types.includes("bool");
  const quoted = (v) => ((textOnly && typeof filterValue(v) !== "string") || (!v.startsWith('"') && readsAsMore(v))
    ? JSON.stringify(v) : v);
  if (op === "in") {
    const items = value.replace(/^\[|\]$/g, "").split(",").map((v) => v.trim()).filter(Boolean);
    return `${field} in [${items.map(quoted).join(",")}]`;
  }
  if (op === "has") return `${field} has ${quoted(value)}`;
  const bare = op === "~=" && (value.startsWith('"') || !readsAsMore(value)); // ~= reads bare text untyped
  return `${field}${op}${bare ? value : quoted(value)}`;
}

// The filter a facet count stands for: its field equal to its value, as `--filter` reads it (a string that
// would read as another type, or as more than itself, in double quotes; null: `FIELD is null`, which also
// matches a missing field); null when no expression says it (an array or object value, a field whose
// name holds an operator character or a space)
export function facetFilter(field, value) {
  if (typeof field !== "string" || !/^[^\s=!<>~"]+$/.test(field)) return null;
  if (value === null) return `${field} is null`;
  if (typeof value === "boolean" || (typeof value === "number" && Number.isFinite(value))) return `${field}=${value}`;
  if (typeof value !== "string") return null;
  const plain = value === value.trim() && value !== "" && filterValue(value) === value &&
                !/["[\]{}]/.test(value) && !/^[=!<>~]/.test(value) && !readsAsMore(value);
  return `${field}=${plain ? value : JSON.stringify(value)}`;
}
