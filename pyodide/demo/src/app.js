// app.js — boots Pyodide from this site (no CDN), installs durable-agent and demo_app.py from
// python-bundle.json into Pyodide's file system, and wires the page to demo_app.DemoController.
//
// Hooks for tests and curious readers: <body data-ready data-status data-saved-step>, and
// window.demo = { loadMs, view() }.

import { loadPyodide } from "./pyodide/pyodide.mjs";
import * as idb from "./idb.js";

const $ = (sel) => document.querySelector(sel);
const params = new URLSearchParams(location.search);
const state = { view: null, busy: false };

function note(text, isError = false) {
  $("#note").textContent = text || "";
  $("#note").className = isError ? "error" : "";
}

function fatal(err) {
  console.error(err);
  document.body.dataset.status = "error";
  note(`The demo failed to start: ${err && err.message ? err.message : err}`, true);
}

// ---- rendering -------------------------------------------------------------------------------

function render(viewJson) {
  const view = JSON.parse(viewJson);
  state.view = view;
  document.body.dataset.status = view.status;
  document.body.dataset.savedStep = view.step_index === null ? "" : String(view.step_index);
  document.body.dataset.runId = view.run_id || "";

  const status = $("#status");
  status.replaceChildren();
  if (view.run_id) {
    const pill = document.createElement("span");
    pill.className = `pill ${view.status}`;
    pill.textContent = view.status;
    status.append("Run ", Object.assign(document.createElement("code"), { textContent: view.run_id.slice(0, 8) }),
      " ", pill);
    if (view.step_index !== null) status.append(" · last stored step ", Object.assign(document.createElement("b"),
      { textContent: String(view.step_index + 1) }));
    if (view.usage !== null) status.append(` · ${view.usage} tokens`);
    status.append(` · model: ${view.model}`);
  } else {
    status.append("No run yet. Start one, then reload the page while it works.");
  }
  if (view.note) note(view.note, view.note.startsWith("error"));

  const list = $("#transcript");
  list.replaceChildren(...view.entries.map((e) => {
    const li = document.createElement("li");
    li.className = `${e.role} ${e.kind}`;
    const label = e.kind === "text" ? `${e.role}: ` : e.kind === "tool-call" ? `→ ${e.tool} ` :
      e.kind === "approval" ? "|| " : e.kind === "tool-error" ? `✗ ${e.tool}: ` : `← ${e.tool}: `;
    li.textContent = label + e.text;
    return li;
  }));
  $("#live").textContent = "";

  const pending = view.pending[0];
  $("#approval").hidden = !pending;
  if (pending) {
    $("#approval-tool").textContent = pending.tool_name;
    $("#approval-input").textContent = JSON.stringify(pending.input);
    $("#approve").dataset.approvalId = pending.approval_id;
    $("#deny").dataset.approvalId = pending.approval_id;
  }
  $("#approve").disabled = $("#deny").disabled = false;

  const counts = new Map();
  for (const e of view.effects.filter((e) => e.run_id === view.run_id)) {
    const key = `${e.tool} ${JSON.stringify(e.input)}`;
    counts.set(key, (counts.get(key) || 0) + 1);
  }
  $("#effects tbody").replaceChildren(...[...counts].map(([k, n]) => {
    const tr = document.createElement("tr");
    tr.innerHTML = "<td></td><td class=n></td>";
    tr.children[0].textContent = k;
    tr.children[1].textContent = `×${n}`;
    tr.dataset.effect = k;
    tr.dataset.count = String(n);
    return tr;
  }));
  $("#start").disabled = view.busy || !["idle", "completed"].includes(view.status);
  $("#forget").disabled = view.busy || !view.run_id;
}

function part(partJson) {
  const p = JSON.parse(partJson);
  const live = $("#live");
  if (p.type === "step-start") {
    live.textContent = `step ${p.step_index + 1}: `;
    document.body.dataset.liveStep = String(p.step_index);
  } else if (p.type === "text-delta") live.textContent += p.text;
  else if (p.type === "tool-call") live.textContent += `\n→ ${p.tool_name} ${JSON.stringify(p.input)} … running`;
  else if (p.type === "tool-result") live.textContent += `\n← ${p.tool_name} done`;
  else if (p.type === "tool-approval-request") live.textContent += `\n|| waiting for your approval`;
}

function status(json) {
  const s = JSON.parse(json);
  if (s.error) note(`error: ${s.error}`, true);
}

// ---- boot ------------------------------------------------------------------------------------

// One tab drives the runs: two tabs resuming the same run would both execute its next step.
// The Web Locks API gives the lock to one document at a time and releases it when the
// document goes away (reload, close), so the next tab or the reloaded page takes over.
function holdTabLock() {
  return new Promise((resolve) => {
    if (!navigator.locks) { resolve(); return; }
    navigator.locks.request("durable-agent-demo:driver", () => { resolve(); return new Promise(() => {}); });
  });
}

async function boot() {
  const t0 = performance.now();
  let haveLock = false;
  const lock = holdTabLock().then(() => { haveLock = true; });
  setTimeout(() => {
    if (!haveLock) note("The demo is open in another tab: close it and this tab takes over.");
  }, 1000);
  const pyodide = await loadPyodide({ indexURL: new URL("./pyodide/", location.href).href });
  const tPyodide = performance.now() - t0;
  const bundle = await (await fetch("./python-bundle.json")).json();
  const root = "/home/pyodide/site";
  for (const [rel, text] of Object.entries(bundle.files)) {
    const file = `${root}/${rel}`;
    pyodide.FS.mkdirTree(file.slice(0, file.lastIndexOf("/")));
    pyodide.FS.writeFile(file, text);
  }
  pyodide.registerJsModule("demo_idb", idb);
  const speed = params.get("speed") === "fast" ? [0.01, 0.2] : [0.05, 0.6];
  const make = pyodide.runPython(`
import sys
sys.path.insert(0, ${JSON.stringify(root)})
import demo_idb, demo_app, durable_agent
def make(ui, model_delay, tool_seconds):
    return demo_app.DemoController(demo_idb, ui, model_delay=model_delay, tool_seconds=tool_seconds)
make`);
  const tImport = performance.now() - t0;
  const ui = { render, part, status };
  const controller = make(ui, speed[0], speed[1]);
  $("#version").textContent = pyodide.runPython("durable_agent.__version__");
  $("#python").textContent = pyodide.runPython("import platform; platform.python_version()");
  $("#pyodide").textContent = pyodide.version;
  $("#prompt").value = pyodide.runPython("demo_app.PROMPT");

  const key = sessionStorage.getItem("demo-api-key");
  if (key) controller.api_key = key;
  await lock;
  note("");
  const outcome = await controller.boot();
  const loadMs = Math.round(performance.now()); // since navigation start
  console.log(`demo: ready ${loadMs} ms after navigation start (loadPyodide ${Math.round(tPyodide)} ms, +import ${Math.round(tImport - tPyodide)} ms, +boot ${Math.round(performance.now() - t0 - tImport)} ms)`);
  window.demo = { loadMs, outcome, view: () => state.view };
  $("#load-ms").textContent = String(loadMs);
  document.body.dataset.ready = "1";

  const guard = (fn) => async (ev) => {
    ev.target.disabled = true;
    try { await fn(ev); } catch (err) { note(`error: ${err.message || err}`, true); ev.target.disabled = false; }
  };
  $("#model-kind").addEventListener("change", () => { $("#openai").hidden = $("#model-kind").value !== "openai"; });
  $("#start").addEventListener("click", guard(async () => {
    note("");
    let config = { kind: "scripted" };
    if ($("#model-kind").value === "openai") {
      const apiKey = $("#api-key").value.trim();
      config = { kind: "openai", base_url: $("#base-url").value.trim(), model: $("#model-name").value.trim(),
        no_key: !apiKey };
      if (!config.base_url || !config.model) throw new Error("enter the endpoint's base URL and model name");
      sessionStorage.setItem("demo-api-key", apiKey);
      controller.api_key = apiKey;
    }
    await controller.start($("#prompt").value, JSON.stringify(config));
  }));
  for (const [sel, approved] of [["#approve", true], ["#deny", false]]) {
    $(sel).addEventListener("click", guard(async (ev) => {
      $("#approve").disabled = $("#deny").disabled = true;
      await controller.answer(ev.target.dataset.approvalId, approved);
    }));
  }
  $("#forget").addEventListener("click", guard(async () => { note(""); await controller.forget(); }));
  $("#reset").addEventListener("click", guard(async () => {
    await controller.forget();
    await idb.clearAll();
    location.reload();
  }));
  $("#reset").disabled = false;
}

boot().catch(fatal);
