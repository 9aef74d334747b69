// The stock AI SDK chat in a real headless Chromium: page/ (chat.mjs on the `ai` package) bundled with esbuild, served
// on 127.0.0.1:argv[3] (an origin the endpoint's CORS allows), against the chat endpoint at argv[2]. Each scenario
// named after them is played in a tab of its own, all at once (chat id `chat-<scenario>`, its prompt tagged
// `#<scenario>`), by clicking and typing as a user does; playwright-core drives Debian's Chromium (CHROMIUM to
// override). Prints, as one JSON line, each scenario's outcome: what the page's chat held and the requests it made to
// the endpoint.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import * as esbuild from "esbuild";
import { chromium } from "playwright-core";
import { serve } from "../../pyodide/demo/serve.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const [base, port, ...scenarios] = process.argv.slice(2);
const WAIT = { timeout: 30_000 };  // a bound for a stuck run, not a speed check
const t0 = Date.now();
const log = (what) => console.error(`[chromium ${((Date.now() - t0) / 1000).toFixed(1)} s] ${what}`);  // on failure

async function play(page, scenario) {
  const out = { requests: [] };
  page.on("response", (response) => {
    const request = response.request();
    if (request.url().startsWith(base) && request.method() !== "OPTIONS")
      out.requests.push(`${request.method()} ${new URL(request.url()).pathname} ${response.status()}`);
  });
  const pageErrors = [];
  page.on("pageerror", (error) => pageErrors.push(String(error)));
  await page.goto(`${site.url}?api=${encodeURIComponent(base)}&chat=chat-${scenario}`);
  await page.waitForSelector("body[data-ready='1']", WAIT);
  const send = async (prompt) => {
    await page.fill("#prompt", `${prompt} #${scenario}`);
    await page.click("#composer button");
  };
  const settled = () => page.waitForFunction(() => document.body.dataset.status === "error"
    || (document.body.dataset.status === "ready" && document.querySelector(".tool[data-state^='output-']")),
  null, WAIT);

  if (scenario === "approve" || scenario === "deny") {
    await send("deploy it");
    const asked = await page.waitForSelector(".tool[data-state='approval-requested']", WAIT);
    out.asked = await asked.evaluate((tool) => tool.firstChild.textContent);
    await page.click(scenario === "approve" ? "button.approve" : "button.deny");
    await settled();
  } else if (scenario === "approve-reload") {
    await send("deploy it");
    await page.waitForSelector(".tool[data-state='approval-requested']", WAIT);
    const continued = page.waitForResponse((r) => r.request().method() === "POST", WAIT);
    await page.click("button.approve");
    await continued;  // the next leg streams (its tool runs): the page reloads now
    out.beforeReload = (await page.evaluate(() => window.chatState())).messages;
    await page.reload();
    await page.waitForSelector("body[data-ready='1']", WAIT);  // set once the resumed stream has ended
  } else if (scenario === "reload") {
    await send("please lookup");
    await page.waitForFunction(() => document.body.dataset.status === "streaming"
      && document.querySelector("li[data-role='assistant']")?.textContent.length > "assistant: ".length, null, WAIT);
    out.beforeReload = (await page.evaluate(() => window.chatState())).messages;
    await page.reload();  // mid-stream: the page's fetch is cut, the run goes on; the new page resumes it on load
    await page.waitForSelector("body[data-ready='1']", WAIT);  // set once the resumed stream has ended
  } else {
    throw new Error(`unknown scenario ${scenario}`);
  }
  return Object.assign(out, await page.evaluate(() => window.chatState()), { pageErrors });
}

const dist = fs.mkdtempSync(path.join(os.tmpdir(), "aisdk-page-"));
fs.copyFileSync(path.join(here, "page", "index.html"), path.join(dist, "index.html"));
await esbuild.build({ entryPoints: [path.join(here, "page", "page.mjs")], outfile: path.join(dist, "page.js"),
  bundle: true, format: "esm", target: "chrome120", logLevel: "error" });
const site = await serve(dist, { port: Number(port) });
log(`page built and served at ${site.url}`);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync"],
});
log("Chromium launched");
const outcomes = {};
try {
  await Promise.all(scenarios.map(async (scenario) => {
    outcomes[scenario] = await play(await browser.newPage(), scenario);
    log(`${scenario}: played`);
  }));
} finally {
  await browser.close();
  await site.close();
  fs.rmSync(dist, { recursive: true, force: true });
}
console.log(JSON.stringify(outcomes));
