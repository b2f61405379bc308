// Calls to the relsearch HTTP API on this origin; the key lives in this tab's session storage
// and travels only in the Authorization header.

const KEY = "relsearch.api-key";

export class ApiError extends Error {
  constructor(status, field, message) {
    super(message);
    this.status = status;
    this.field = field; // the request field at fault, as the API names it (null when none is)
  }
}

export function setKey(key) {
  if (key) sessionStorage.setItem(KEY, key);
  else sessionStorage.removeItem(KEY);
}

async function send(path, body) {
  const headers = {};
  const key = sessionStorage.getItem(KEY);
  if (key) headers.Authorization = `Bearer ${key}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  try {
    return await fetch(path, {method: body === undefined ? "GET" : "POST", headers,
                              body: body === undefined ? undefined : JSON.stringify(body)});
  } catch (e) {
    throw new ApiError(0, null, `the server did not answer (${e.message})`);
  }
}

function failure(response, answer) {
  const error = answer && answer.error ? answer.error : {field: null, message: response.statusText};
  return new ApiError(response.status, error.field, error.message);
}

export async function call(path, body) {
  const response = await send(path, body);
  const answer = await response.json().catch(() => null);
  if (!response.ok) throw failure(response, answer);
  return answer;
}

// A POST answered with a file (POST /search?format=csv|jsonl): its bytes as a Blob; errors as call's
export async function file(path, body) {
  const response = await send(path, body);
  if (!response.ok) throw failure(response, await response.json().catch(() => null));
  return response.blob();
}

export const get = (path, params = {}) => {
  const query = new URLSearchParams(Object.entries(params).filter(([, v]) => v !== null && v !== undefined));
  return call(query.size ? `${path}?${query}` : path);
};
