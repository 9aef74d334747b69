// Runs one Python script of this project under a pinned Pyodide in Node.js, offline. The benches
// use it to time pure code inside WebAssembly (benches/bench_codec.py --pyodide).
//
// Usage: node pyodide/run-python.mjs [--runtime 314|028] SCRIPT [ARGS...]
//
//   * The runtime comes from pyodide/node_modules (`npm ci` in pyodide/ first); no wheels are
//     loaded: the script may import the standard library and the project's own `python/` only.
//   * The project is mounted at its own path (read-only by convention: the script must not write
//     there), sys.argv is [SCRIPT, ARGS...], and the exit code is the script's (SystemExit), 1 for
//     an uncaught Python exception, 70 if the runner or the runtime failed.

import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import { fileURLToPath, pathToFileURL } from "node:url";

const RUNTIMES = { "314": ["pyodide-314", "314.0.7"], "028": ["pyodide-028", "0.28.2"] };
const EXIT_RUNNER = 70;
const here = path.dirname(fileURLToPath(import.meta.url));
const project = path.resolve(here, "..");

function fail(message) {
  process.stderr.write(`run-python: ${message}\n`);
  process.exit(EXIT_RUNNER);
}

let argv = process.argv.slice(2);
let runtimeName = "314";
if (argv[0] === "--runtime") [runtimeName, argv] = [argv[1], argv.slice(2)];
const runtime = RUNTIMES[runtimeName];
if (!runtime) fail(`--runtime must be one of ${Object.keys(RUNTIMES).join(", ")}, not ${runtimeName}`);
if (argv.length === 0) fail("usage: node pyodide/run-python.mjs [--runtime 314|028] SCRIPT [ARGS...]");
const script = path.resolve(argv[0]);
if (!script.startsWith(project + path.sep)) fail(`${script} is not inside the project ${project}`);

const [pkg, version] = runtime;
let pyodideModule;
try {
  pyodideModule = createRequire(import.meta.url).resolve(`${pkg}/pyodide.mjs`);
} catch {
  fail(`${pkg} is not installed: run (cd pyodide && npm ci)`);
}
const { loadPyodide } = await import(pathToFileURL(pyodideModule).href);
const pyodide = await loadPyodide({ env: { HOME: "/home/pyodide", PYTHONDONTWRITEBYTECODE: "1" } });
if (pyodide.version !== version) fail(`loaded Pyodide ${pyodide.version}, expected ${version}`);
pyodide.setStdout({ write: (buf) => fs.writeSync(1, buf) });
pyodide.setStderr({ write: (buf) => fs.writeSync(2, buf) });
pyodide.FS.mkdirTree(project);
pyodide.FS.mount(pyodide.FS.filesystems.NODEFS, { root: project }, project);

const run = pyodide.runPython(`
def __durable_agent_run_script(script, args):
    import runpy, sys, traceback

    sys.dont_write_bytecode = True
    sys.argv = [script, *args]
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return 0
__durable_agent_run_script
`);
let code;
try {
  code = run(script, argv.slice(1));
} catch (e) {
  fail(`Pyodide failed outside Python's control: ${String(e).split("\n")[0]}`);
}
process.exit(code);
