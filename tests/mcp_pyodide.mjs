// Runs durable-agent's own MCP client inside Pyodide in Node.js (fetch, no SDK) against a live MCP server:
// a run through `stream_chat` with `mcp_servers=[HttpServer(URL)]`; prints its outcome as one JSON line.
//
// Usage: node tests/mcp_pyodide.mjs URL        (the runtime: pyodide/node_modules, `npm ci` in pyodide/)

import path from "node:path";
import { createRequire } from "node:module";
import { fileURLToPath, pathToFileURL } from "node:url";

const project = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const require = createRequire(path.join(project, "pyodide", "package.json"));
const { loadPyodide } = await import(pathToFileURL(require.resolve("pyodide-314/pyodide.mjs")).href);
const pyodide = await loadPyodide();
pyodide.FS.mkdirTree(project);
pyodide.FS.mount(pyodide.FS.filesystems.NODEFS, { root: project }, project);
pyodide.globals.set("URL", process.argv[2]);
pyodide.globals.set("PROJECT", project);
const outcome = await pyodide.runPythonAsync(`
import json, sys
sys.path.insert(0, PROJECT + "/python")
from durable_agent import ScriptedModel, StreamToolProgress, call, reply, stream_chat
from durable_agent.mcp import HttpServer

model = ScriptedModel([reply("", call("balance", {"account": "w"}, "b"), call("slow", {"seconds": 0.2}, "s"),
                             call("snapshot", {}, "p"), call("refuse", {"reason": "no"}, "r")), "done"])
stream = stream_chat(model=model, messages=[{"role": "user", "content": "go"}],
                     mcp_servers=[HttpServer(URL, connect_timeout=60)])
parts = [part async for part in stream.full_stream]
result = await stream.result()
results = {p["tool_call_id"]: p for m in result.messages if m["role"] == "tool" for p in m["content"]}
json.dumps({
    "platform": sys.platform,
    "sdk_loaded": any(m.split(".")[0] in ("mcp", "httpx2", "anyio") for m in sys.modules),
    "text": result.text,
    "balance": results["b"]["output"],
    "refused": [results["r"]["is_error"], results["r"]["output"]],
    "image": results["p"]["attachments"][0]["data"][:4].hex(),
    "progress": [p.progress for p in parts if isinstance(p, StreamToolProgress)],
})
`);
console.log(outcome);
process.exit(0); // pending Python timers (call timeouts) would keep Node alive
