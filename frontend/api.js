// REST + SSE client for the endpoints of docs/architecture.md.  The token comes from the
// HTML shell (<body data-token>) and goes as a Bearer header on fetch and ?token= on
// EventSource (which cannot send headers).
const token = () => document.body.dataset.token || "";

// message: "422: name: String should have at most 200 characters"; detail: the part after
// the status, for a sentence of the page's own
export class ApiError extends Error {
  constructor(status, message, detail = message) { super(message); this.status = status; this.detail = detail; }
}

export const UNREACHABLE = "The torchscope server is unreachable. Is `torchscope serve` still running?";

export async function api(path, opts = {}) {
  const headers = { ...(opts.headers || {}) };
  if (token()) headers.Authorization = `Bearer ${token()}`;
  let resp;
  try {
    resp = await fetch(path, { ...opts, headers });
  } catch (e) {
    throw new ApiError(0, UNREACHABLE);
  }
  if (!resp.ok) {
    let detail = resp.statusText;
    try { detail = describe(await resp.json()); } catch { /* not JSON */ }
    throw new ApiError(resp.status, `${resp.status}: ${detail}`, detail);
  }
  const type = resp.headers.get("content-type") || "";
  return type.includes("json") ? resp.json() : resp;
}

// FastAPI's refusals: a string, or for a request that fails validation a list of
// {loc, msg}, said as "name: String should have at most 200 characters".
function describe(j) {
  if (typeof j.detail === "string") return j.detail;
  if (Array.isArray(j.detail)) return j.detail.map((d) => `${(d.loc || []).filter((x) => x !== "body").join(".")}: ${d.msg}`).join("; ");
  return JSON.stringify(j.detail ?? j);
}

export const sessionPath = (id) => `/api/sessions/${encodeURIComponent(id)}`;

export function rankQuery(rank) { return rank === undefined || rank === null ? "" : `rank=${rank}`; }

// Every step event of a rank, page by page (the server caps one answer at 10,000 steps).
export async function allSteps(id, rank) {
  const res = [];
  for (let offset = 0; ; offset += 10000) {
    const page = await api(`${sessionPath(id)}/steps?rank=${rank}&limit=10000&offset=${offset}`);
    res.push(...page);
    if (page.length < 10000) return res;
  }
}

// The header's dot: whether this page hears the server's live channel (not whether the run
// is still going; the status badge says that).
export function showConnection(el) {
  return (ok) => {
    el.textContent = ok ? "● connected" : "○ disconnected";
    el.title = ok ? "live updates from the torchscope server" : "the torchscope server is unreachable; the browser keeps retrying";
    el.className = ok ? "ok" : "bad";
  };
}

// One EventSource per page; listeners filter by session.  Reconnects are done by the browser.
export function live(onEvent, onState = () => {}) {
  const url = "/api/live" + (token() ? `?token=${encodeURIComponent(token())}` : "");
  const es = new EventSource(url);
  es.onmessage = (m) => { try { onEvent(JSON.parse(m.data)); } catch { /* ignore malformed */ } };
  es.onopen = () => onState(true);
  es.onerror = () => onState(false);
  return es;
}
