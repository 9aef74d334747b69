#!/usr/bin/env node
// server-e2e.mjs — the demo's server mode, end to end: the page (server.html) in headless Chromium,
// the agent in a real uvicorn process (server_app.py, durable_agent.http.ChatEndpoint on SQLite).
//
//   1. baseline: start a run, approve the deploy, let it finish; keep each step's text.
//   2. the unbreakable stream: start a run, RELOAD the page while it streams, then SIGKILL the server
//      while a tool runs and start a new server on the same port. The page's EventSource reconnects
//      with Last-Event-ID; the new server takes the run over. Approve, let it finish. The page must
//      hold events 1..n exactly once, each step's text must equal the baseline's, and no tool
//      effect may have happened twice.
//
// Usage: node server-e2e.mjs [--headed]
// Env:   CHROMIUM (default /usr/bin/chromium), PYTHON (default: the repo's .venv/bin/python; it needs uvicorn)
// Exit:  0 all checks passed, 1 a check failed, 2 setup failed.

import { spawn } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "./build.mjs";
import { serve } from "./serve.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, "..", "..");
const executablePath = process.env.CHROMIUM || "/usr/bin/chromium";
const python = process.env.PYTHON || path.join(repo, ".venv", "bin", "python");
const WAIT = 60_000;
const t0 = Date.now();
const log = (msg) => console.log(`[server-e2e ${((Date.now() - t0) / 1000).toFixed(1).padStart(5)}s] ${msg}`);

class CheckFailed extends Error {}
function check(cond, message) {
  if (!cond) throw new CheckFailed(message);
  log(`ok: ${message}`);
}

for (const [what, file] of [["Chromium", executablePath], ["Python", python]]) {
  if (!fs.existsSync(file)) { console.error(`server-e2e: no ${what} at ${file}`); process.exit(2); }
}
let chromium;
try {
  ({ chromium } = await import("playwright-core"));
} catch (err) {
  console.error(`server-e2e: playwright-core is not installed (run "npm ci" in ${here}): ${err.message}`);
  process.exit(2);
}
const watchdog = setTimeout(() => { console.error("server-e2e: timed out after 240 s"); process.exit(1); }, 240_000);

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "server-e2e-"));
const db = path.join(tmp, "demo.db");
const ledger = path.join(tmp, "ledger.jsonl");
const freePort = () => new Promise((resolve) => {
  const probe = net.createServer().listen(0, "127.0.0.1", () => { const { port } = probe.address(); probe.close(() => resolve(port)); });
});
const apiPort = await freePort();
const api = `http://127.0.0.1:${apiPort}`;
const dist = build();
const site = await serve(dist);
const origin = site.url.replace(/\/$/, "");

let server = null;
async function startServer() {
  server = spawn(python, ["-m", "uvicorn", "--factory", "server_app:create", "--app-dir", here, "--host", "127.0.0.1",
    "--port", String(apiPort), "--log-level", "warning"], {
    // Each tool runs 1.5 s: the kill below lands while the second one runs even when a loaded machine delays
    // the page's sight of its tool-call event (at 0.5 s the tool had sometimes finished by then).
    env: { ...process.env, DEMO_DB: db, DEMO_LEDGER: ledger, DEMO_ORIGINS: origin, DEMO_SPEED: "fast",
      DEMO_TOOL_SECONDS: "1.5" },
    stdio: ["ignore", "inherit", "inherit"],
  });
  const deadline = Date.now() + 30_000;
  while (Date.now() < deadline) {
    if (server.exitCode !== null) throw new Error(`the server exited (${server.exitCode})`);
    const up = await new Promise((resolve) => {
      const sock = net.connect(apiPort, "127.0.0.1", () => { sock.end(); resolve(true); });
      sock.on("error", () => resolve(false));
    });
    if (up) { log(`server up on ${api} (pid ${server.pid})`); return; }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error("the server did not start listening");
}
function killServer() {
  const exited = new Promise((resolve) => server.once("exit", resolve));
  server.kill("SIGKILL");
  return exited;
}

const browser = await chromium.launch({
  executablePath,
  headless: !process.argv.includes("--headed"),
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync"],
});
const context = await browser.newContext();
const pageErrors = [];

async function openPage() {
  const page = await context.newPage();
  page.on("pageerror", (err) => pageErrors.push(err.message));
  page.on("console", (msg) => { if (msg.type() === "error" && msg.text().startsWith("event ")) pageErrors.push(msg.text()); });
  await page.goto(`${site.url}server.html?api=${encodeURIComponent(api)}`);
  await page.waitForSelector("body[data-ready='1']", { timeout: WAIT });
  return page;
}
const waitStatus = (page, status) => page.waitForSelector(`body[data-status='${status}']`, { timeout: WAIT });
const attr = (page, name) => page.getAttribute("body", `data-${name}`);
const waitUntil = (page, fn, arg) => page.waitForFunction(fn, arg, { timeout: WAIT });

async function finishWithApproval(page) {
  await waitStatus(page, "waiting");
  await page.click("#approve");
  await waitStatus(page, "stop");
}

function ledgerCounts() {
  const counts = new Map();
  for (const line of fs.existsSync(ledger) ? fs.readFileSync(ledger, "utf8").split("\n").filter(Boolean) : []) {
    counts.set(line, (counts.get(line) || 0) + 1);
  }
  return counts;
}

let failed = false;
try {
  await startServer();

  log("1. baseline: a run with nothing in its way");
  const first = await openPage();
  await first.click("#start");
  await finishWithApproval(first);
  const baseline = await first.evaluate(() => window.serverDemo.texts());
  check(baseline.length >= 5, `the baseline run streamed ${baseline.length} steps of text`);
  await first.close();
  const afterBaseline = ledgerCounts();

  log("2. the unbreakable stream: a reload mid-stream, then a server SIGKILLed while a tool runs");
  let page = await openPage();
  await page.click("#start");
  const runId = await page.waitForFunction(() => document.body.dataset.runId, null, { timeout: WAIT }).then((h) => h.jsonValue());
  await waitUntil(page, () => Number(document.body.dataset.textDeltas) >= 3);
  const beforeReload = await attr(page, "seqs");
  await page.reload();
  await page.waitForSelector("body[data-ready='1']", { timeout: WAIT });
  check((await attr(page, "seqs")).startsWith(beforeReload), "after the reload the page kept the events it had and reconnected");
  await waitUntil(page, () => Number(document.body.dataset.toolCalls) >= 2);
  await killServer();
  log(`server killed while a tool ran (the page had events ${(await attr(page, "seqs")).split(",").length})`);
  await startServer();
  await finishWithApproval(page);
  const seqs = (await attr(page, "seqs")).split(",").map(Number);
  check(seqs.every((s, i) => s === i + 1), `the page holds events 1..${seqs.length}, each exactly once`);
  check((await attr(page, "gaps")) === "0", "no event arrived out of order or twice");
  const texts = await page.evaluate(() => window.serverDemo.texts());
  check(JSON.stringify(texts) === JSON.stringify(baseline), "each step's text equals the baseline run's");
  const interrupted = await page.evaluate(() => window.serverDemo.state.events.some((e) =>
    e.type === "tool-result" && e.is_error && /interrupted/.test(e.output)));
  check(interrupted, "the tool the kill cut off was reported as interrupted, not run again");
  const view = await (await fetch(`${api}/runs/${runId}`)).json();
  check(view.status === "completed" && view.last_event_id === seqs.length, "the server's view: completed, same last event id");
  const counts = ledgerCounts();
  const twice = [...counts].filter(([line, n]) => n - (afterBaseline.get(line) || 0) > 1);
  check(twice.length === 0, "no tool effect of the interrupted run happened twice");
  check(pageErrors.length === 0, `no page errors${pageErrors.length ? `: ${pageErrors.join("; ")}` : ""}`);
} catch (err) {
  failed = true;
  console.error(err instanceof CheckFailed ? `server-e2e: FAILED: ${err.message}` : err);
} finally {
  clearTimeout(watchdog);
  await browser.close();
  await site.close();
  if (server && server.exitCode === null) server.kill("SIGTERM");
  fs.rmSync(tmp, { recursive: true, force: true });
}
log(failed ? "FAILED" : "all checks passed");
process.exit(failed ? 1 : 0);
