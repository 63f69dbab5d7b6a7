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
// A 401: the server is up, but it needs a token and this page has none or another one (a
// server restarted with a new token, or now bound beyond loopback, which makes one up).
export const TOKEN_REFUSED = "The torchscope server refused this page's token: it needs its token, and this page has none " +
  "or another one (was the server restarted with a new token?). Open the URL torchscope printed (`torchscope serve`, or " +
  "`torchscope.watch` in your script), the one ending in ?token=…";

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
    if (resp.status === 401) throw new ApiError(401, TOKEN_REFUSED, TOKEN_REFUSED);
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
export async function allSteps(id, rank, start = null) {
  const res = [];
  const from = start === null || start === undefined ? "" : `&start=${start}`; // (from that step on)
  for (let offset = 0; ; offset += 10000) {
    const page = await api(`${sessionPath(id)}/steps?rank=${rank}${from}&limit=10000&offset=${offset}`);
    res.push(...page);
    if (page.length < 10000) return res;
  }
}

// The header's dot: whether this page hears the server's live channel (not whether the run
// is still going; the status badge says that); ``refused``: the server answered, with a refusal.
export function showConnection(el) {
  return (ok, refused = null) => {
    el.textContent = ok ? "● connected" : refused?.status === 401 ? "○ token refused" : refused ? "○ refused" : "○ disconnected";
    el.title = ok ? "live updates from the torchscope server" : refused ? refused.message : "the torchscope server is unreachable; the browser keeps retrying";
    el.className = ok ? "ok" : "bad";
  };
}

const RETRY_MS = 3000;

// One EventSource per page; listeners filter by session.  After a network failure the browser
// reconnects by itself; an HTTP error answer (a 401 of a server restarted with another token,
// a proxy's 502) closes the EventSource for good without saying which.  Then a fetch of the
// same URL asks: a refusal (400, 401, 403) reaches ``onState(false, error)`` in words, not as
// "unreachable", and the page tries again every few seconds (a server started again with the
// page's token is heard again).
export function live(onEvent, onState = () => {}) {
  const url = "/api/live" + (token() ? `?token=${encodeURIComponent(token())}` : "");
  const connect = () => {
    const es = new EventSource(url);
    es.onmessage = (m) => { try { onEvent(JSON.parse(m.data)); } catch { /* ignore malformed */ } };
    es.onopen = () => onState(true);
    es.onerror = () => { if (es.readyState === EventSource.CLOSED) whyClosed(); else onState(false); };
  };
  const whyClosed = async () => {
    const stop = new AbortController();
    try {
      await api("/api/live", { signal: stop.signal }); // answered: the stream itself is not wanted
      stop.abort();
      onState(false);
    } catch (e) {
      onState(false, e instanceof ApiError && [400, 401, 403].includes(e.status) ? e : null);
    }
    setTimeout(connect, RETRY_MS);
  };
  connect();
}
