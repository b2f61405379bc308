// What a search ran and how its score reads, from GET /relations and the answer alone (no DOM here): a
// recipe in words (retrieval/recipe.py Recipe.describe), what an answer says its query plan ran (its
// `mode` and combined `recipe`: retrieval/plan.py decides, the page only reads), and the parts of each
// hit's score (its `explain`).

const isObject = (x) => typeof x === "object" && x !== null && !Array.isArray(x);
const isNumber = (x) => typeof x === "number" && Number.isFinite(x);
const DEPTH = 100;  // retrieval/recipe.py DEPTH: a recipe's default pool

// Python's format(x, "g"): 6 significant digits, no trailing zeros, an exponent below 1e-4 or from 1e6
export function g(x) {
  if (!isNumber(x)) return String(x);
  if (x === 0) return Object.is(x, -0) ? "-0" : "0";
  const [mantissa, power] = x.toExponential(5).split("e");
  const exponent = Number(power);
  const strip = (s) => (s.includes(".") ? s.replace(/\.?0+$/, "") : s);
  if (exponent < -4 || exponent >= 6) {
    return `${strip(mantissa)}e${exponent < 0 ? "-" : "+"}${String(Math.abs(exponent)).padStart(2, "0")}`;
  }
  return strip(x.toFixed(5 - exponent));
}

// A bundle's recipe entry as {mixture, bm25, title, same, prior, unanswered, neighbours, prominence, mentions, depth},
// or null
// when it is not one (a bundle is data: a field of another type is not read as a recipe)
export function readRecipe(entry) {
  if (!isObject(entry) || !isObject(entry.mixture)) return null;
  const numbers = (object) => Object.entries(object).every(([, w]) => isNumber(w));
  const keyed = Object.fromEntries(["same", "prior", "unanswered", "mentions"]
    .map((k) => [k, entry[k] === undefined ? {} : entry[k]]));
  if (!numbers(entry.mixture) || !Object.values(keyed).every((o) => isObject(o) && numbers(o))) return null;
  const share = (key) => (entry[key] === undefined ? 0 : entry[key]);
  if (!["bm25", "title", "neighbours", "prominence"].every((key) => isNumber(share(key)))) return null;
  return {mixture: {...entry.mixture}, bm25: share("bm25"), title: share("title"), same: {...keyed.same},
          prior: {...keyed.prior}, unanswered: {...keyed.unanswered}, neighbours: share("neighbours"),
          prominence: share("prominence"),
          mentions: {...keyed.mentions}, depth: isNumber(entry.depth) ? entry.depth : DEPTH};
}

// Recipe.describe(): e.g. "0.3·minmax(1·similar-company) + 0.7·minmax(bm25) + 0.5·same gics_sub_industry_code"
export function describe(recipe) {
  const dense = [...Object.entries(recipe.mixture).map(([name, w]) => `${g(w)}·${name}`),
                 ...(recipe.title ? [`${g(recipe.title)}·title`] : [])].join(" + ");
  const parts = [recipe.bm25 ? `${g(1 - recipe.bm25)}·minmax(${dense}) + ${g(recipe.bm25)}·minmax(bm25)` : dense];
  for (const [field, w] of Object.entries(recipe.same)) if (w) parts.push(`${g(w)}·same ${field}`);
  for (const [name, w] of Object.entries(recipe.prior || {})) if (w) parts.push(`${g(w)}·prior(${name})`);
  for (const [name, w] of Object.entries(recipe.unanswered || {})) if (w) parts.push(`${g(w)}·unanswered(${name})`);
  if (recipe.neighbours) parts.push(`${g(recipe.neighbours)}·neighbours`);
  if (recipe.prominence) parts.push(`${g(recipe.prominence)}·prominence`);
  for (const [field, w] of Object.entries(recipe.mentions || {})) if (w) parts.push(`${g(w)}·mentions within ${field}`);
  const described = parts.join(" + ");
  return recipe.depth === DEPTH ? described : `${described} (pool ${recipe.depth})`;
}

// What an answer says its query plan ran, in words: "runs " and the combined recipe (an rrf of its dense
// search with BM25 for mode rrf); "" for a projection (its own space, no recipe) or a recipe this page cannot read
export function ranWords(answer) {
  const recipe = isObject(answer) ? readRecipe(answer.recipe) : null;
  if (!recipe || answer.mode === "projection") return "";
  return `runs ${answer.mode === "rrf" ? "rrf(dense, bm25) of " : ""}${describe(recipe)}`;
}

// The score scale of each mode, as the page labels a score (plan.SCALES in words)
export const SCALES = {
  dense: {label: "cosine", title: "⟨q, t̂⟩: a cosine, or the weighted sum of cosines of a mixture"},
  projection: {label: "cosine", title: "cosine in the relation's projected space"},
  recipe: {label: "recipe score", title: "(1 − b)·minmax(dense) + b·minmax(BM25) + bonuses: in [0, 1 + bonuses] " +
                                         "within the candidate pool, below 0 past it. Not a cosine."},
  rrf: {label: "rrf", title: "reciprocal rank fusion of the dense and BM25 lists: Σ 1/(60 + rank), at most 0.033. " +
                             "Not a cosine."},
};

const PART_LABELS = {"recipe:dense": "dense", "recipe:bm25": "BM25", "recipe:past-pool": "past the pool"};

// A recipe part's label and kind: recipe:same:FIELD → "same FIELD", recipe:prior:RELATION → "prior RELATION",
// recipe:unanswered:RELATION → "unanswered RELATION", recipe:mentions:FIELD → "mentions FIELD"
function partName(key) {
  for (const kind of ["same", "prior", "unanswered", "mentions"]) {
    if (key.startsWith(`recipe:${kind}:`)) return {label: `${kind} ${key.slice(`recipe:${kind}:`.length)}`, kind};
  }
  return {label: PART_LABELS[key] || key.slice("recipe:".length), kind: key.slice("recipe:".length)};
}

// The parts of one hit's score that add up to it: [{key, label, value, kind}], kind one of dense, bm25,
// same, prior, past-pool, mixture, score. Recipe mode: the recipe:* parts; a dense mixture: its mixture:NAME
// parts; otherwise (one operator, rrf, a projection) the score alone, labelled `single`.
export function scoreParts(hit, mode, single) {
  const explain = isObject(hit.explain) ? hit.explain : {};
  const named = (prefix) => Object.entries(explain).filter(([k, v]) => k.startsWith(prefix) && isNumber(v));
  let parts = [];
  if (mode === "recipe") {
    parts = named("recipe:").map(([key, value]) => ({key, value, ...partName(key)}));
  } else if (mode === "dense") {
    parts = named("mixture:").map(([key, value]) => ({key, value, label: key.slice("mixture:".length), kind: "mixture"}));
  }
  const sum = parts.reduce((total, p) => total + p.value, 0);
  if (!parts.length || !isNumber(hit.score) || Math.abs(sum - hit.score) > 1e-3 * Math.max(1, Math.abs(hit.score))) {
    return [{key: "score", value: isNumber(hit.score) ? hit.score : 0, label: single, kind: "score"}];
  }
  return parts;
}

// `explain` entries that are not parts of the score: the raw dense ⟨q, t̂⟩, the title's cosine, each operator's cosine
export function cosines(hit) {
  const explain = isObject(hit.explain) ? hit.explain : {};
  return Object.entries(explain).filter(([k, v]) => !k.startsWith("recipe:") && !k.startsWith("mixture:") && isNumber(v));
}
