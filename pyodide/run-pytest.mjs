#!/usr/bin/env node
// run-pytest.mjs — run durable-agent's pytest suite inside Pyodide (CPython compiled to WebAssembly)
// under Node.js, offline. This is the local stand-in for Cloudflare Python Workers, which run these
// same Pyodide builds.
//
// Usage (any cwd):
//   node pyodide/run-pytest.mjs --runtime 314|028 [--wheels DIR] [--project DIR]
//        [--summary-json FILE] [--no-jspi] [-- PYTEST ARGS...]
//
//   --runtime       which pinned Pyodide to use: "314" (pyodide@314.0.7, Python 3.14) or
//                   "028" (pyodide@0.28.2, Python 3.13). Both come from pyodide/node_modules
//                   (npm aliases pyodide-314 and pyodide-028, see package.json).
//   --wheels        directory of pure-Python wheels (pytest, hypothesis and their dependencies) to
//                   install before running; default .pyodide-wheels/py<major><minor> of the project.
//                   scripts/test-pyodide fills it with pyodide/fetch-wheels.sh.
//   --project       the project root (holds pyproject.toml); default: this script's parent directory.
//   --summary-json  write {runtime, pyodide, python, jspi, exit_code, counts, startup_ms,
//                   load_pyodide_ms, load_wheels_ms, suite_ms} there (JSON).
//   --no-jspi       do not enable WebAssembly stack switching (JSPI); the conftest hook then runs
//                   `async def` tests on a pure-Python loop. Also: PYODIDE_NO_JSPI=1.
//   PYTEST ARGS     passed to pytest.main (default: the testpaths of pyproject.toml).
//
// Guarantees:
//   * No network: globalThis.fetch (what Pyodide downloads with) and Node's socket connect (what
//     a Python socket becomes: a WebSocket opened by Node) throw before Pyodide loads. The runtime
//     comes from node_modules, wheels from the local directory; nothing else is loaded.
//   * The project is mounted read-only (NODEFS wrapped so every write fails with EROFS) at its
//     own absolute path, so tracebacks show host paths. /tmp stays in-memory (tmp_path works).
//     Hypothesis' example database goes to /tmp; pytest's cache provider and .pyc writing are off.
//   * A wheel that fails to load fails the run (loadPackage only logs such errors; we collect them).
//   * The exit code is pytest's own (0 ok, 1 failures, 2 interrupted, 3 internal error, 4 usage
//     error, 5 no tests collected), or 70 if the runner or Python failed outside pytest.
//   * The last line printed is the summary: "pyodide-314: N passed, N failed, N skipped".

import { spawnSync } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import path from "node:path";
import tty from "node:tty";
import { createRequire } from "node:module";
import { fileURLToPath, pathToFileURL } from "node:url";

const RUNTIMES = {
  "314": { pkg: "pyodide-314", version: "314.0.7", python: "3.14" },
  "028": { pkg: "pyodide-028", version: "0.28.2", python: "3.13" },
};
const EXIT_RUNNER = 70;
const here = path.dirname(fileURLToPath(import.meta.url));

function fail(message) {
  process.stderr.write(`run-pytest: ${message}\n`);
  process.exit(EXIT_RUNNER);
}

// ---- arguments ---------------------------------------------------------------------------------
const argv = process.argv.slice(2);
const opts = { runtime: null, wheels: null, project: path.resolve(here, ".."), summaryJson: null,
  jspi: !process.env.PYODIDE_NO_JSPI, pytestArgs: [] };
for (let i = 0; i < argv.length; i++) {
  const a = argv[i];
  const value = () => {
    if (i + 1 >= argv.length) fail(`${a} needs a value`);
    return argv[++i];
  };
  if (a === "--") { opts.pytestArgs = argv.slice(i + 1); break; }
  else if (a === "--runtime") opts.runtime = value();
  else if (a === "--wheels") opts.wheels = path.resolve(value());
  else if (a === "--project") opts.project = path.resolve(value());
  else if (a === "--summary-json") opts.summaryJson = path.resolve(value());
  else if (a === "--no-jspi") opts.jspi = false;
  else if (a === "-h" || a === "--help") {
    const lines = fs.readFileSync(fileURLToPath(import.meta.url), "utf8").split("\n").slice(1);
    const header = lines.slice(0, lines.findIndex((l) => !l.startsWith("//")));
    process.stdout.write(header.map((l) => l.slice(3)).join("\n") + "\n");
    process.exit(0);
  } else fail(`unknown option ${a} (pytest arguments go after --)`);
}
const runtime = RUNTIMES[opts.runtime];
if (!runtime) fail(`--runtime must be one of ${Object.keys(RUNTIMES).join(", ")}, not ${opts.runtime}`);
opts.wheels ??= path.join(opts.project, ".pyodide-wheels", "py" + runtime.python.replace(".", ""));
if (!fs.existsSync(path.join(opts.project, "pyproject.toml")))
  fail(`${opts.project} is not the project root (no pyproject.toml)`);

// ---- JSPI (WebAssembly stack switching) ---------------------------------------------------------
// asyncio.run() inside Pyodide blocks on JS promises, which needs JSPI: behind
// --experimental-wasm-stack-switching on Node 20/21, --experimental-wasm-jspi on 22-24, default later.
// Re-exec ourselves once with the flag this node knows.
const hasJspi = () =>
  typeof WebAssembly.Suspending === "function" || typeof WebAssembly.Suspender === "function";
if (opts.jspi && !hasJspi() && !process.env.__DURABLE_AGENT_PYODIDE_REEXEC) {
  const v8opts = spawnSync(process.execPath, ["--v8-options"], { encoding: "utf8" }).stdout || "";
  const flag = ["--experimental-wasm-jspi", "--experimental-wasm-stack-switching"]
    .find((f) => v8opts.includes(f + " "));
  if (!flag) fail("this node has no JSPI flag; use Node >= 20 or pass --no-jspi");
  const r = spawnSync(process.execPath, [...process.execArgv, flag, ...process.argv.slice(1)],
    { stdio: "inherit", env: { ...process.env, __DURABLE_AGENT_PYODIDE_REEXEC: "1" } });
  process.exit(r.status ?? EXIT_RUNNER);
}
if (opts.jspi && !hasJspi()) fail("JSPI flag given but WebAssembly.Suspending is still missing");

// ---- no network ---------------------------------------------------------------------------------
const NO_NETWORK = "network access is disabled in the durable-agent Pyodide runner";
globalThis.fetch = function fetch(resource) {
  throw new Error(`${NO_NETWORK} (fetch ${String(resource?.url ?? resource)})`);
};
// A Python socket.connect() in Pyodide under Node becomes a WebSocket (package `ws`) opened by Node.
net.Socket.prototype.connect = function connect() {
  throw new Error(`${NO_NETWORK} (socket connect)`);
};

// ---- load the pinned runtime --------------------------------------------------------------------
const requireHere = createRequire(import.meta.url);
let pyodideModule;
try {
  pyodideModule = requireHere.resolve(`${runtime.pkg}/pyodide.mjs`);
} catch {
  fail(`${runtime.pkg} is not installed: run (cd pyodide && npm ci)`);
}
const pkgJson = JSON.parse(fs.readFileSync(path.join(path.dirname(pyodideModule), "package.json"), "utf8"));
if (pkgJson.version !== runtime.version)
  fail(`${runtime.pkg} is ${pkgJson.version}, expected exactly ${runtime.version}: run (cd pyodide && npm ci)`);
const { loadPyodide } = await import(pathToFileURL(pyodideModule).href);

const wheels = fs.existsSync(opts.wheels)
  ? fs.readdirSync(opts.wheels).filter((f) => f.endsWith(".whl")).sort().map((f) => path.join(opts.wheels, f))
  : [];
if (wheels.length === 0) fail(`no wheels in ${opts.wheels} (run pyodide/fetch-wheels.sh ${opts.runtime})`);

const env = {
  HOME: "/home/pyodide",
  HYPOTHESIS_STORAGE_DIRECTORY: "/tmp/.hypothesis",
  PYTHONDONTWRITEBYTECODE: "1",
  PYODIDE_TEST_RUNNER: "durable-agent", // lets tests/test_pyodide_runtime.py check this runner's guarantees
};
for (const [k, v] of Object.entries(process.env))
  if (/^(PYTEST_ADDOPTS|PYTEST_PLUGINS|HYPOTHESIS_PROFILE|DURABLE_AGENT_\w+|CI|NO_COLOR|FORCE_COLOR|TERM|COLUMNS|LINES|TZ)$/.test(k))
    env[k] = v;

const t0 = performance.now();
const pyodide = await loadPyodide({ env, packages: [] });
const loadMs = performance.now() - t0;
if (pyodide.version !== runtime.version) fail(`loaded Pyodide ${pyodide.version}, expected ${runtime.version}`);

// Raw byte pass-through of Python's stdout/stderr (keeps pytest's progress output unbuffered).
const rawWriter = (fd) => ({ write: (buf) => fs.writeSync(fd, buf), isatty: tty.isatty(fd) });
pyodide.setStdout(rawWriter(1));
pyodide.setStderr(rawWriter(2));

// loadPackage() does not throw when a wheel fails to load (it only logs): collect and fail.
const loadErrors = [];
await pyodide.loadPackage(wheels, { messageCallback: () => {}, errorCallback: (m) => loadErrors.push(m) });
if (loadErrors.length) fail("failed to load wheels:\n" + loadErrors.join("\n"));
const wheelsMs = performance.now() - t0 - loadMs;

// ---- mount the project read-only ----------------------------------------------------------------
// NODEFS has no read-only option, so wrap it: every node it creates gets operation tables where
// each mutating operation throws EROFS ("Read-only file system"), as on a read-only mount. The
// modes stay the host's: masking write bits would make Emscripten's own permission check answer
// EACCES first for creations, a less truthful error.
function readOnlyNodeFS(FS, NODEFS) {
  const EROFS = 69; // Emscripten's errno numbering (errno.EROFS inside Pyodide)
  const O_ACCMODE = 3, O_TRUNC = 512, O_CREAT = 64;
  const deny = () => { throw new FS.ErrnoError(EROFS); };
  const node_ops = {
    ...NODEFS.node_ops,
    lookup(parent, name) { return wrap(NODEFS.node_ops.lookup(parent, name)); },
    setattr: deny, mknod: deny, rename: deny, unlink: deny, rmdir: deny, symlink: deny,
  };
  const stream_ops = {
    ...NODEFS.stream_ops,
    open(stream) {
      if ((stream.flags & O_ACCMODE) !== 0 || stream.flags & (O_TRUNC | O_CREAT)) deny();
      return NODEFS.stream_ops.open(stream);
    },
    setattr: deny, write: deny, msync: deny,
  };
  function wrap(node) {
    node.node_ops = node_ops;
    node.stream_ops = stream_ops;
    return node;
  }
  return { mount: (mount) => wrap(NODEFS.mount(mount)), node_ops, stream_ops };
}
const FS = pyodide.FS;
const mountPoint = ["/", "/tmp", "/home", "/lib", "/dev", "/proc"].some(
  (p) => opts.project === p || (p !== "/" && opts.project.startsWith(p + "/")))
  ? "/mnt/project" : opts.project;
FS.mkdirTree(mountPoint);
FS.mount(readOnlyNodeFS(FS, FS.filesystems.NODEFS), { root: opts.project }, mountPoint);
const startupMs = performance.now() - t0;

// ---- run pytest ---------------------------------------------------------------------------------
// Called through callPromising() when JSPI is on, so asyncio.run() inside tests may block on JS
// promises. A plugin object records the outcome counts from the terminal reporter.
const runPytest = pyodide.runPython(`
def __durable_agent_run_pytest(mount_point, args, progress):
    import os, sys, time

    sys.dont_write_bytecode = True
    os.chdir(mount_point)
    args = ["-p", "no:cacheprovider", *list(args)]
    sys.argv = ["pytest", *args]
    import pytest

    counts = {}

    class _Counts:
        def pytest_runtest_logstart(self, nodeid, location):
            progress.current = nodeid  # kept on the JS side: readable even if the runtime dies

        def pytest_runtest_logfinish(self, nodeid, location):
            progress.finished += 1

        @pytest.hookimpl(trylast=True)
        def pytest_terminal_summary(self, terminalreporter):
            for key, reports in terminalreporter.stats.items():
                if key:
                    counts[key] = len(reports)

    start = time.perf_counter()
    code = int(pytest.main(args, plugins=[_Counts()]))
    sys.stdout.flush()
    sys.stderr.flush()
    return {"exit_code": code, "counts": counts, "suite_ms": (time.perf_counter() - start) * 1000,
            "python": sys.version.split()[0]}
__durable_agent_run_pytest
`);
const label = `pyodide-${opts.runtime}`;
process.stderr.write(`${label}: Pyodide ${pyodide.version}, JSPI ${hasJspi() ? "on" : "off"}, ` +
  `${wheels.length} wheels, project mounted read-only at ${mountPoint}, start-up ${(startupMs / 1000).toFixed(2)} s ` +
  `(loadPyodide ${(loadMs / 1000).toFixed(2)} s, wheels ${(wheelsMs / 1000).toFixed(2)} s)\n`);
let result;
const progress = { current: null, finished: 0 };
try {
  const ret = opts.jspi
    ? await runPytest.callPromising(mountPoint, opts.pytestArgs, progress)
    : runPytest(mountPoint, opts.pytestArgs, progress);
  result = ret.toJs({ dict_converter: Object.fromEntries });
  ret.destroy?.();
} catch (e) {
  const where = progress.current
    ? `, during ${progress.current} (after ${progress.finished} finished tests)` : "";
  const hint = /Maximum call stack size exceeded/.test(String(e))
    ? "\n  (a JavaScript stack overflow: recursion too deep for the runtime's stack, which kills" +
      " Pyodide instead of raising RecursionError; make that code iterative)" : "";
  process.stdout.write(`${label}: Pyodide crashed${where}\n`);
  fail(`Pyodide failed outside pytest's control${where}: ${String(e).split("\n")[0]}${hint}`);
}
const c = result.counts;
const n = (k) => (c[k] ?? 0);
const summary = {
  runtime: opts.runtime, pyodide: pyodide.version, python: result.python, jspi: hasJspi(),
  exit_code: result.exit_code, counts: c, startup_ms: Math.round(startupMs),
  load_pyodide_ms: Math.round(loadMs), load_wheels_ms: Math.round(wheelsMs), suite_ms: Math.round(result.suite_ms),
};
if (opts.summaryJson) fs.writeFileSync(opts.summaryJson, JSON.stringify(summary, null, 2) + "\n");
const extra = ["error", "xfailed", "xpassed", "deselected"].filter((k) => n(k)).map((k) => `, ${n(k)} ${k}`).join("");
process.stdout.write(
  `${label}: Pyodide ${pyodide.version}, Python ${result.python}, start-up ${(startupMs / 1000).toFixed(2)} s, ` +
  `suite ${(result.suite_ms / 1000).toFixed(2)} s, pytest exit code ${result.exit_code}${extra}\n` +
  `${label}: ${n("passed")} passed, ${n("failed") + n("error")} failed, ${n("skipped")} skipped\n`);
process.exit(result.exit_code);
