// The page's state and its URL (?id=MSFT&relation=similar-company:0.7&filter=gics_sector=Energy&k=10),
// and filter expressions in `relsearch query --filter` syntax. What a filter means is decided by the
// server (POST /filters/parse runs the CLI's own parser); here an expression is only split into the
// field / operator / value of a filter row, when a row can show it exactly.

export const FILTER_OPS = ["=", "!=", "~=", ">", ">=", "<", "<=", "in", "has", "exists", "is null", "is not null"];
const NO_VALUE = new Set(["exists", "is null", "is not null"]);
const WORDS = /^([^\s=!<>~]+)\s+(?:(in|has)\s+(.*\S)|(exists|is null|is not null))\s*$/s;
// the field runs to the first operator character (trimmed after): linear time on any text
const COMPARISON = /^([^=!<>~]+)(!=|~=|>=|<=|=|>|<)(.*)$/s;

export function readState(search) {
  const params = new URLSearchParams(search);
  const relations = Object.create(null); // keyed by names from the URL: "__proto__" is a name like any other
  for (const spec of params.getAll("relation")) {
    const cut = spec.lastIndexOf(":");
    const weight = cut > 0 ? Number(spec.slice(cut + 1)) : NaN;
    if (Number.isFinite(weight)) relations[spec.slice(0, cut)] = weight;
    else relations[spec] = 1; // a relation alone runs its stored recipe, as `--relation R` does
  }
  return {
    index: params.get("index") || "",
    mode: params.has("id") ? "id" : "text",
    text: params.get("text") || "",
    id: params.get("id") || "",
    relations,
    filters: params.getAll("filter"),
    k: Number(params.get("k")) || 10,
    hybrid: params.get("hybrid") || "",
    columns: params.has("cols") ? params.get("cols").split(",").filter(Boolean) : null,
  };
}

export function writeState(state) {
  const params = new URLSearchParams();
  if (state.index) params.set("index", state.index);
  if (state.mode === "id") params.set("id", state.id);
  else params.set("text", state.text);
  for (const [name, weight] of Object.entries(state.relations)) params.append("relation", `${name}:${weight}`);
  for (const spec of state.filters) params.append("filter", spec);
  params.set("k", String(state.k));
  if (state.hybrid) params.set("hybrid", state.hybrid);
  if (state.columns) params.set("cols", state.columns.join(","));
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

// True when `spec` joins expressions with " or " outside double quotes (as the CLI splits them)
function joinsWithOr(spec) {
  let quoted = false;
  for (let i = 0; i < spec.length; i += 1) {
    if (spec[i] === '"' && (i === 0 || spec[i - 1] !== "\\")) quoted = !quoted;
    else if (!quoted && spec.startsWith(" or ", i)) return true;
  }
  return false;
}

// {field, op, value} of a filter row that shows `spec` exactly, or null when a row cannot (a negation
// "not ...", alternatives "A or B", text this splitter does not read): that one stays as written
export function rowParts(spec) {
  if (/^\s*not\s/.test(spec) || joinsWithOr(spec)) return null;
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
  const quoted = (v) => (textOnly && typeof filterValue(v) !== "string" ? JSON.stringify(v) : v);
  if (op === "in") {
    const items = value.replace(/^\[|\]$/g, "").split(",").map((v) => v.trim()).filter(Boolean);
    return `${field} in [${items.map(quoted).join(",")}]`;
  }
  if (op === "has") return `${field} has ${quoted(value)}`;
  return `${field}${op}${op === "~=" ? value : quoted(value)}`;
}
