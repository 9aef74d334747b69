// server.js — the demo's server mode: the page talks to durable_agent.http.ChatEndpoint.
//
// A run's events arrive over EventSource, each with an id. The page keeps the events it has in
// sessionStorage (per tab, so they survive a reload) and reconnects with the last id (?after= on
// a new connection; EventSource sends Last-Event-ID itself when it reconnects after a dropped
// connection or a server restart). The endpoint sends exactly the events after that id.
//
// Hooks for the e2e test: <body data-status data-run-id data-seqs data-gaps data-tool-calls>,
// window.serverDemo = { state, texts() }.

const $ = (sel) => document.querySelector(sel);
const api = (new URLSearchParams(location.search).get("api") || "http://127.0.0.1:8010").replace(/\/$/, "");
const KEY = "durable-agent-server-demo";
const saved = JSON.parse(sessionStorage.getItem(KEY) || "null");
const state = saved || { runId: null, sessionId: null, events: [], status: "idle" };
let source = null;
let gaps = 0;

const save = () => sessionStorage.setItem(KEY, JSON.stringify(state));
const lastId = () => (state.events.length ? state.events[state.events.length - 1].seq : 0);

function note(text, isError = false) {
  $("#note").textContent = text || "";
  $("#note").style.color = isError ? "var(--bad)" : "";
}

function texts() {  // each step's streamed text (of its last model call attempt: a retry drops the failed one's)
  const steps = new Map();
  for (const e of state.events) {
    if (e.type === "step-retry") steps.delete(e.step_index);
    else if (e.type === "text-delta") steps.set(e.step_index, (steps.get(e.step_index) || "") + e.text);
  }
  return [...steps.keys()].sort((a, b) => a - b).map((k) => steps.get(k));
}

function pendingApproval() {
  if (state.status !== "waiting") return null;
  const answered = new Set(state.events.filter((e) => e.type === "tool-result").map((e) => e.tool_call_id));
  return state.events.filter((e) => e.type === "tool-approval-request").find((e) => !answered.has(e.tool_call_id));
}

function render() {
  const body = document.body.dataset;
  body.status = state.status;
  body.runId = state.runId || "";
  body.seqs = state.events.map((e) => e.seq).join(",");
  body.gaps = String(gaps);
  body.toolCalls = String(state.events.filter((e) => e.type === "tool-call").length);
  body.textDeltas = String(state.events.filter((e) => e.type === "text-delta").length);
  $("#status").textContent = state.runId ? `run ${state.runId.slice(0, 12)} · ${state.status} · event ${lastId()}` : "";
  const items = [];
  const byStep = new Map();
  for (const e of state.events) {
    if (e.type === "text-delta") {
      let li = byStep.get(e.step_index);
      if (!li) {
        li = Object.assign(document.createElement("li"), { className: "text", textContent: "assistant: " });
        byStep.set(e.step_index, li);
        items.push(li);
      }
      li.textContent += e.text;
    } else if (e.type === "tool-call") {
      items.push(Object.assign(document.createElement("li"), { className: "tool-call",
        textContent: `→ ${e.tool_name} ${JSON.stringify(e.input)}` }));
    } else if (e.type === "tool-result") {
      items.push(Object.assign(document.createElement("li"), { className: e.is_error ? "tool-result error" : "tool-result",
        textContent: `← ${e.tool_name}: ${typeof e.output === "string" ? e.output : JSON.stringify(e.output)}` }));
    } else if (e.type === "tool-approval-request") {
      items.push(Object.assign(document.createElement("li"), { className: "approval", textContent: `|| ${e.tool_name} needs approval` }));
    } else if (e.type === "error") {
      items.push(Object.assign(document.createElement("li"), { className: "error", textContent: e.message }));
    }
  }
  $("#transcript").replaceChildren(...items);
  const pending = pendingApproval();
  $("#approval").hidden = !pending;
  if (pending) {
    $("#approval-tool").textContent = pending.tool_name;
    $("#approval-input").textContent = JSON.stringify(pending.input);
  }
  $("#start").disabled = !["idle", "stop", "error"].includes(state.status);
}

function connect() {
  if (source) source.close();
  source = new EventSource(`${api}/runs/${encodeURIComponent(state.runId)}/events?after=${lastId()}`);
  state.status = "streaming";
  render();
  source.onmessage = (message) => {
    const event = JSON.parse(message.data);
    if (event.seq !== lastId() + 1) { gaps += 1; console.error(`event ${event.seq} after ${lastId()}`); }
    if (event.seq <= lastId()) return;
    state.events.push(event);
    if (event.type === "finish") state.status = event.finish_reason === "suspended" ? "waiting" : "stop";
    else if (event.type === "error") state.status = "error";
    else state.status = "streaming";
    if (event.type === "finish" || event.type === "error") { source.close(); source = null; }
    save();
    render();
  };
  source.onerror = () => {
    if (source && source.readyState === EventSource.CONNECTING) { state.status = "reconnecting"; render(); }
  };
}

async function call(method, path, body, headers = {}) {
  const response = await fetch(`${api}${path}`, { method, headers: { "content-type": "application/json", ...headers },
    body: body === undefined ? undefined : JSON.stringify(body) });
  const answer = response.status === 204 ? null : await response.json();
  if (!response.ok) throw new Error(`${response.status} ${answer && answer.error ? answer.error.message : ""}`);
  return answer;
}

$("#start").addEventListener("click", async () => {
  note("");
  state.sessionId = state.sessionId || `demo-${crypto.randomUUID()}`;
  const run = await call("POST", "/runs", { session_id: state.sessionId, prompt: $("#prompt").value },
    { "idempotency-key": crypto.randomUUID() });
  Object.assign(state, { runId: run.run_id, events: [], status: "streaming" });
  save();
  connect();
});

for (const [sel, approved] of [["#approve", true], ["#deny", false]]) {
  $(sel).addEventListener("click", async () => {
    const pending = pendingApproval();
    if (!pending) return;
    $("#approve").disabled = $("#deny").disabled = true;
    try {
      await call("POST", `/runs/${encodeURIComponent(state.runId)}/approvals`,
        { approval_id: pending.approval_id, approved, token: pending.token });
      connect();
    } catch (err) { note(`error: ${err.message}`, true); }
    $("#approve").disabled = $("#deny").disabled = false;
  });
}

$("#forget").addEventListener("click", () => {
  if (source) source.close();
  sessionStorage.removeItem(KEY);
  location.reload();
});

window.serverDemo = { state, texts };
render();
if (state.runId && !["stop", "error", "waiting"].includes(state.status)) connect();
document.body.dataset.ready = "1";
