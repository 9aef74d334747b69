#!/usr/bin/env node
// build.mjs — assemble the static site in pyodide/demo/dist/:
//   index.html, app.js, idb.js              the page (from src/)
//   python-bundle.json                      durable-agent's sources (python/durable_agent) + demo_app.py
//                                           + examples/demo_agent.py (the scripted conversation, shared)
//   pyodide/                                the Pyodide runtime, copied from node_modules (no CDN)
// Any static file server can serve dist/ (it must send .wasm as application/wasm); serve.mjs does.
// Usage: node build.mjs [--out DIR]

import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, "..", "..");

export function build(out = path.join(here, "dist")) {
  const pyodideDir = path.join(here, "node_modules", "pyodide");
  if (!fs.existsSync(path.join(pyodideDir, "pyodide.mjs")))
    throw new Error(`${pyodideDir} is missing: run "npm ci" in ${here}`);
  fs.rmSync(out, { recursive: true, force: true });
  fs.mkdirSync(path.join(out, "pyodide"), { recursive: true });
  for (const f of ["index.html", "app.js", "idb.js", "server.html", "server.js"]) fs.copyFileSync(path.join(here, "src", f), path.join(out, f));
  for (const f of fs.readdirSync(pyodideDir)) {
    if (/\.(mjs|js|wasm|zip|json)$/.test(f) && !f.endsWith(".map")) fs.copyFileSync(path.join(pyodideDir, f), path.join(out, "pyodide", f));
  }
  const files = {};
  const pkg = path.join(repo, "python", "durable_agent");
  const walk = (dir) => {
    for (const entry of fs.readdirSync(dir, { withFileTypes: true }).sort((a, b) => a.name.localeCompare(b.name))) {
      const full = path.join(dir, entry.name);
      if (entry.isDirectory()) { if (entry.name !== "__pycache__") walk(full); }
      else if (entry.name.endsWith(".py")) files[path.relative(path.join(repo, "python"), full).split(path.sep).join("/")] = fs.readFileSync(full, "utf8");
    }
  };
  walk(pkg);
  if (!files["durable_agent/__init__.py"]) throw new Error(`no durable_agent package under ${pkg}`);
  files["demo_app.py"] = fs.readFileSync(path.join(here, "src", "demo_app.py"), "utf8");
  files["demo_agent.py"] = fs.readFileSync(path.join(repo, "examples", "demo_agent.py"), "utf8");  // the shared script
  fs.writeFileSync(path.join(out, "python-bundle.json"), JSON.stringify({ files }));
  return out;
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const i = process.argv.indexOf("--out");
  const out = build(i > 0 ? path.resolve(process.argv[i + 1]) : undefined);
  console.log(`built ${out}`);
}
