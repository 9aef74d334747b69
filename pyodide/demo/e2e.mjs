#!/usr/bin/env node
// e2e.mjs — the demo, end to end, in a real headless Chromium (Debian's /usr/bin/chromium,
// driven by playwright-core; no browser download), against the built page served on 127.0.0.1.
//
//   1. baseline: start a run, approve the deploy when asked, let it finish; keep its transcript.
//   2. the unbreakable run: start a new run, RELOAD the page while step 3 is in flight, check that
//      the page resumed the same run from IndexedDB, let it reach the approval, CLOSE the tab and
//      open a new one, approve from there, let it finish. Its transcript and token usage must equal
//      the baseline's, and steps finished before the reload must not have run again.
//   3. deny: a third run, denied at the approval: the tool never runs, the model is told why.
//   4. the page's OpenAI-compatible model adapter (pure Python over the browser's fetch), against a
//      stand-in endpoint served by this script on 127.0.0.1 that speaks the chat-completions
//      streaming format (SSE; a tool call split across chunks, then an answer). Real providers
//      are not reachable from this machine; this checks the adapter's wire format, not a provider.
//
//   --extended adds (about a minute more):
//   5. a reload before the first step was stored: the run restarts with the same id;
//   6. a second tab waits (Web Lock) while the first drives the run, and takes over when it closes.
//
// Usage: node e2e.mjs [--screenshot FILE.png] [--extended] [--headed]
// Env:   CHROMIUM=/path/to/chromium (default /usr/bin/chromium)
// Exit:  0 all checks passed, 1 a check failed, 2 setup failed (no Chromium, no node_modules).

import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "./build.mjs";
import { serve } from "./serve.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const args = process.argv.slice(2);
const screenshot = args.includes("--screenshot") ? path.resolve(args[args.indexOf("--screenshot") + 1]) : null;
const executablePath = process.env.CHROMIUM || "/usr/bin/chromium";
const WAIT = 90_000;
const t0 = Date.now();
const log = (msg) => console.log(`[e2e ${((Date.now() - t0) / 1000).toFixed(1).padStart(5)}s] ${msg}`);

class CheckFailed extends Error {}
function check(cond, message) {
  if (!cond) throw new CheckFailed(message);
  log(`ok: ${message}`);
}

if (!fs.existsSync(executablePath)) {
  console.error(`e2e: no Chromium at ${executablePath} (apt-get install chromium, or set CHROMIUM)`);
  process.exit(2);
}
let chromium;
try {
  ({ chromium } = await import("playwright-core"));
} catch (err) {
  console.error(`e2e: playwright-core is not installed (run "npm ci" in ${here}): ${err.message}`);
  process.exit(2);
}

// A hard stop, so a hung browser can never hang CI.
const extended = args.includes("--extended");
const limitS = extended ? 300 : 180;
const watchdog = setTimeout(() => { console.error(`e2e: timed out after ${limitS} s`); process.exit(1); }, limitS * 1000);

// ---- a stand-in OpenAI-compatible endpoint (scenario 4) ------------------------------------------
const llmRequests = [];
const sse = (obj) => `data: ${JSON.stringify(obj)}\n\n`;
function fakeChatCompletions(req, res, url) {
  if (url.pathname !== "/v1/chat/completions") return false;
  let raw = "";
  req.on("data", (c) => { raw += c; });
  req.on("end", () => {
    const body = JSON.parse(raw);
    llmRequests.push({ authorization: req.headers.authorization, body });
    const afterTool = body.messages.some((m) => m.role === "tool");
    const chunks = afterTool ? [
      sse({ choices: [{ index: 0, delta: { role: "assistant", content: "The bug: login() does not " } }] }),
      sse({ choices: [{ index: 0, delta: { content: "lower-case the email." } }] }),
      sse({ choices: [{ index: 0, delta: {}, finish_reason: "stop" }] }),
      sse({ choices: [], usage: { prompt_tokens: 80, completion_tokens: 9, total_tokens: 89 } }),
    ] : [
      sse({ choices: [{ index: 0, delta: { role: "assistant", content: "Let me read " } }] }),
      sse({ choices: [{ index: 0, delta: { content: "the code." } }] }),
      sse({ choices: [{ index: 0, delta: { tool_calls: [{ index: 0, id: "call_abc", type: "function",
        function: { name: "read_file", arguments: '{"path": ' } }] } }] }),
      sse({ choices: [{ index: 0, delta: { tool_calls: [{ index: 0, function: { arguments: '"app/login.py"}' } }] } }] }),
      sse({ choices: [{ index: 0, delta: {}, finish_reason: "tool_calls" }] }),
      sse({ choices: [], usage: { prompt_tokens: 50, completion_tokens: 12, total_tokens: 62 } }),
    ];
    chunks.push("data: [DONE]\n\n");
    res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
    const text = chunks.join("");
    // Cut the stream at arbitrary points (not at event boundaries), as networks do.
    const pieces = [];
    for (let i = 0; i < text.length; i += 37) pieces.push(text.slice(i, i + 37));
    const next = () => { if (pieces.length) { res.write(pieces.shift()); setTimeout(next, 5); } else res.end(); };
    next();
  });
  return true;
}

const dist = build();
const site = await serve(dist, { extra: fakeChatCompletions });
log(`serving ${dist} at ${site.url}`);
const browser = await chromium.launch({
  executablePath,
  headless: !args.includes("--headed"),
  // Debian's Chromium as root, on a machine with no outside network: these flags keep it from
  // phoning home (its connections would be refused) and from needing a sandbox or a GPU.
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync"],
});
const context = await browser.newContext({ viewport: { width: 1180, height: 860 } });
const pageErrors = [];

async function openPage() {
  const page = await context.newPage();
  page.on("pageerror", (err) => pageErrors.push(err.message));
  page.on("console", (msg) => {
    if (msg.type() === "error" && !msg.text().includes("404")) pageErrors.push(msg.text());
    if (msg.text().startsWith("demo:")) log(msg.text());
  });
  const started = Date.now();
  await page.goto(site.url);
  await ready(page, started);
  return page;
}

async function ready(page, started) {
  await page.waitForSelector("body[data-ready='1'], body[data-status='error']", { timeout: WAIT });
  const status = await page.getAttribute("body", "data-status");
  if (status === "error") throw new CheckFailed(`the page failed to start: ${await page.textContent("#note")}`);
  const loadMs = await page.evaluate(() => window.demo.loadMs);
  log(`page ready (${loadMs} ms after navigation start; ${Date.now() - started} ms wall), status ${status}`);
  return loadMs;
}

const waitStatus = (page, status) => page.waitForSelector(`body[data-status='${status}']`, { timeout: WAIT });
const view = (page) => page.evaluate(() => window.demo.view());
const transcriptText = (page) => page.innerText("#transcript");

async function approvalShown(page) {
  await page.waitForSelector("#approval:not([hidden])", { timeout: WAIT });
  return page.innerText("#approval");
}

function effectsOf(v) {
  const counts = {};
  for (const e of v.effects.filter((e) => e.run_id === v.run_id)) {
    const key = `${e.tool} ${JSON.stringify(e.input)}`;
    counts[key] = (counts[key] || 0) + 1;
  }
  return counts;
}

let exitCode = 0;
const loads = [];
try {
  // ---- 1. baseline: no reload --------------------------------------------------------------------
  let page = await openPage();
  loads.push(await page.evaluate(() => window.demo.loadMs));
  check((await page.getAttribute("body", "data-status")) === "idle", "a fresh browser has no run");
  await page.click("#start");
  await waitStatus(page, "suspended");
  check((await approvalShown(page)).includes("deploy"), "the run stops at the deploy and shows Approve/Deny");
  await page.click("#approve");
  await waitStatus(page, "completed");
  const baseline = { text: await transcriptText(page), view: await view(page) };
  check(baseline.view.entries.length >= 15, `baseline finished with ${baseline.view.entries.length} transcript entries`);
  check(Object.values(effectsOf(baseline.view)).every((n) => n === 1) && Object.keys(effectsOf(baseline.view)).length === 5,
    "baseline ran each of its 5 tool calls once");

  // ---- 2. the same run, reloaded mid-step, then closed and reopened at the approval ---------------
  await page.click("#forget");
  await waitStatus(page, "idle");
  await page.click("#start");
  await page.waitForSelector("body[data-saved-step='1'][data-live-step='2']", { timeout: WAIT });
  await page.waitForFunction(() => document.querySelector("#live").textContent.length > 12, null, { timeout: WAIT });
  const before = await view(page);
  log(`reloading while step 3 is in flight (stored: ${before.step_index + 1} steps; live: ` +
    `${JSON.stringify(await page.textContent("#live"))})`);
  const reloadStarted = Date.now();
  await page.reload();
  loads.push(await ready(page, reloadStarted));
  const afterReload = await view(page);
  check(afterReload.run_id === before.run_id, `the reloaded page picked up run ${before.run_id.slice(0, 8)}`);
  check((await page.evaluate(() => window.demo.outcome)) === "resumed", "it resumed the run (status was running)");
  check(/resumed from storage after step \d/.test(afterReload.note), `the page says: "${afterReload.note}"`);
  await waitStatus(page, "suspended");
  await approvalShown(page);
  if (screenshot) {
    await page.screenshot({ path: screenshot, fullPage: true });
    log(`screenshot: ${screenshot} (${fs.statSync(screenshot).size} bytes)`);
  }
  await page.close();
  page = await openPage(); // closing the tab and coming back
  loads.push(await page.evaluate(() => window.demo.loadMs));
  check((await page.evaluate(() => window.demo.outcome)) === "suspended", "the reopened tab shows the suspended run");
  check((await view(page)).run_id === before.run_id, "same run after close and reopen");
  check((await approvalShown(page)).includes("deploy"), "the approval is still pending after close and reopen");
  await page.click("#approve");
  await waitStatus(page, "completed");
  const resumed = { text: await transcriptText(page), view: await view(page) };
  check(resumed.text === baseline.text, "the resumed run's transcript equals the baseline's, entry for entry");
  check(JSON.stringify(resumed.view.entries) === JSON.stringify(baseline.view.entries), "same stored history");
  check(resumed.view.usage === baseline.view.usage, `same token usage (${resumed.view.usage})`);
  check(resumed.view.step_index === baseline.view.step_index, `same number of steps (${resumed.view.step_index + 1})`);
  const effects = effectsOf(resumed.view);
  log(`side effects of the resumed run: ${JSON.stringify(effects)}`);
  check(effects['read_file {"path":"tests/test_login.py"}'] === 1 && effects['read_file {"path":"app/login.py"}'] === 1,
    "steps stored before the reload did not run again");
  check(effects['deploy {"service":"auth","version":"1.4.2"}'] === 1, "the approved deploy ran exactly once");
  check(Object.values(effects).every((n) => n <= 2), "no tool ran more than twice (only the step in flight may repeat)");

  // ---- 3. deny ----------------------------------------------------------------------------------
  await page.click("#forget");
  await waitStatus(page, "idle");
  await page.click("#start");
  await waitStatus(page, "suspended");
  await approvalShown(page);
  await page.click("#deny");
  await waitStatus(page, "completed");
  const denied = await view(page);
  const denial = denied.entries.find((e) => e.kind === "tool-error" && e.tool === "deploy");
  check(denial && denial.text.includes("Denied by the user."), `a denied deploy is an error result: "${denial && denial.text}"`);
  check(!Object.keys(effectsOf(denied)).some((k) => k.startsWith("deploy")), "a denied deploy never runs");

  // ---- 4. the OpenAI-compatible adapter against the stand-in endpoint ----------------------------
  await page.click("#forget");
  await waitStatus(page, "idle");
  await page.selectOption("#model-kind", "openai");
  await page.fill("#base-url", `${site.url}v1`);
  await page.fill("#model-name", "test-model");
  await page.fill("#api-key", "sk-test-key");
  await page.fill("#prompt", "Why does the login test fail?");
  await page.click("#start");
  await waitStatus(page, "completed");
  const llm = await view(page);
  const llmText = await transcriptText(page);
  check(llm.model === "openai", "the run used the OpenAI-compatible adapter");
  check(llmText.includes('→ read_file {"path": "app/login.py"}') && llmText.includes("← read_file: def login(email)"),
    "a tool call streamed in pieces was assembled and executed");
  check(llmText.includes("assistant: The bug: login() does not lower-case the email."), "the final answer streamed in");
  check(llm.usage === 62 + 89, `usage from the stream's last chunk (${llm.usage})`);
  check(llmRequests.length === 2 && llmRequests.every((r) => r.authorization === "Bearer sk-test-key" &&
    r.body.model === "test-model" && r.body.stream === true), "two streamed requests with the key and model");
  const tools = llmRequests[0].body.tools.map((t) => t.function.name).sort().join(",");
  check(tools === "deploy,read_file,run_tests,write_file", `the tools were offered as functions (${tools})`);
  const second = llmRequests[1].body.messages;
  check(second.some((m) => m.role === "assistant" && m.tool_calls && m.tool_calls[0].id === "call_abc") &&
    second.some((m) => m.role === "tool" && m.tool_call_id === "call_abc" && m.content.includes("def login")),
    "the second request carried the assistant's tool call and its result");

  if (extended) {
    // ---- 5. a reload before anything was stored --------------------------------------------------
    await page.click("#forget");
    await waitStatus(page, "idle");
    await page.selectOption("#model-kind", "scripted");
    await page.click("#start");
    await page.waitForSelector("body[data-live-step='0']", { timeout: WAIT });
    const early = await view(page);
    check(early.step_index === null, "reloading during step 1, before any checkpoint");
    const earlyStarted = Date.now();
    await page.reload();
    loads.push(await ready(page, earlyStarted));
    check((await page.evaluate(() => window.demo.outcome)) === "restarted" &&
      (await view(page)).run_id === early.run_id, "the run restarted with the same id");
    await waitStatus(page, "suspended");

    // ---- 6. a second tab waits for the first -----------------------------------------------------
    const second = await context.newPage();
    second.on("pageerror", (err) => pageErrors.push(err.message));
    await second.goto(site.url);
    await second.waitForFunction(() => document.querySelector("#note").textContent.includes("another tab"), null,
      { timeout: WAIT });
    check((await second.getAttribute("body", "data-ready")) === "0", "a second tab waits while the first drives");
    await page.close();
    page = second;
    await page.waitForSelector("body[data-ready='1']", { timeout: WAIT });
    check((await page.evaluate(() => window.demo.outcome)) === "suspended" &&
      (await view(page)).run_id === early.run_id, "it takes over when the first tab closes");
  }

  check(pageErrors.length === 0, `no page errors${pageErrors.length ? ": " + pageErrors.join(" | ") : ""}`);
} catch (err) {
  exitCode = 1;
  console.error(err instanceof CheckFailed ? `e2e: FAILED: ${err.message}` : `e2e: FAILED: ${err.stack || err}`);
  if (pageErrors.length) console.error(`page errors: ${pageErrors.join(" | ")}`);
} finally {
  await browser.close().catch(() => {});
  await site.close();
  clearTimeout(watchdog);
}
log(`page loads: ${loads.map((ms) => `${ms} ms`).join(", ")}`);
log(exitCode === 0 ? "e2e: all checks passed" : "e2e: failed");
process.exit(exitCode);
