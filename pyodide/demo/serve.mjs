#!/usr/bin/env node
// serve.mjs — a tiny static file server for the built demo, on 127.0.0.1 only.
// Usage: node serve.mjs [--port 8000]     (builds dist/ first, then serves it)
// Import: const { url, close } = await serve(dir, { port: 0 })

import fs from "node:fs";
import http from "node:http";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "./build.mjs";

const TYPES = {
  ".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".mjs": "text/javascript; charset=utf-8",
  ".json": "application/json", ".wasm": "application/wasm", ".zip": "application/zip", ".css": "text/css",
  ".png": "image/png", ".ico": "image/x-icon",
};

export function serve(root, { port = 0, host = "127.0.0.1", extra = null } = {}) {
  root = path.resolve(root);
  const server = http.createServer((req, res) => {
    const url = new URL(req.url, "http://localhost");
    if (extra && extra(req, res, url)) return;
    let file = path.normalize(path.join(root, decodeURIComponent(url.pathname)));
    if (!file.startsWith(root)) { res.writeHead(403).end(); return; }
    if (fs.existsSync(file) && fs.statSync(file).isDirectory()) file = path.join(file, "index.html");
    fs.readFile(file, (err, data) => {
      if (err) { res.writeHead(404, { "content-type": "text/plain" }).end("not found"); return; }
      // The Pyodide runtime never changes under a given URL (its version is pinned): let the browser
      // cache it, which also lets Chromium cache the compiled WebAssembly across reloads.
      const immutable = url.pathname.startsWith("/pyodide/");
      res.writeHead(200, { "content-type": TYPES[path.extname(file)] || "application/octet-stream",
        "cache-control": immutable ? "public, max-age=86400, immutable" : "no-cache" }).end(data);
    });
  });
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => {
      const { port: p } = server.address();
      resolve({ url: `http://${host}:${p}/`, server, close: () => new Promise((r) => server.close(r)) });
    });
  });
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const i = process.argv.indexOf("--port");
  const dir = build();
  const { url } = await serve(dir, { port: i > 0 ? Number(process.argv[i + 1]) : 8000 });
  console.log(`serving ${dir} at ${url} (Ctrl-C to stop)`);
}
