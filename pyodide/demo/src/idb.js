// idb.js — the few IndexedDB operations the demo's Python code needs, as Promise-returning
// functions. Python reaches them as the JS module `demo_idb` (pyodide.registerJsModule) and awaits
// them; it only ever stores strings (the codec text of serialize_checkpoint, JSON, base64).
//
// Object stores of the database "durable-agent-demo":
//   checkpoints  run id -> checkpoint text (what serialize_checkpoint produced, bytes included)
//   meta         small settings: the approval secret, the active run, the model choice
//   effects      an append-only ledger of tool side effects (auto-increment keys)
// Writes use durability "strict": the transaction completes only once the browser has flushed
// it, so a checkpoint reported saved survives a crash of the tab or the browser.

const DB_NAME = "durable-agent-demo";
const DB_VERSION = 1;
const STORES = ["checkpoints", "meta", "effects"];

let dbPromise = null;

function request(req) {
  return new Promise((resolve, reject) => {
    req.onsuccess = () => resolve(req.result);
    req.onerror = () => reject(req.error);
  });
}

function db() {
  if (!dbPromise) {
    dbPromise = new Promise((resolve, reject) => {
      if (!globalThis.indexedDB) {
        reject(new Error("this browser has no IndexedDB (private mode?): the demo cannot store checkpoints"));
        return;
      }
      const open = indexedDB.open(DB_NAME, DB_VERSION);
      open.onupgradeneeded = () => {
        const d = open.result;
        for (const name of STORES) {
          if (!d.objectStoreNames.contains(name)) {
            d.createObjectStore(name, name === "effects" ? { autoIncrement: true } : undefined);
          }
        }
      };
      open.onsuccess = () => resolve(open.result);
      open.onerror = () => reject(open.error);
      open.onblocked = () => reject(new Error("IndexedDB upgrade blocked by another open tab of the demo"));
    });
  }
  return dbPromise;
}

function checkStore(store) {
  if (!STORES.includes(store)) throw new Error(`unknown object store ${store}`);
}

async function tx(store, mode, body) {
  checkStore(store);
  const d = await db();
  const t = d.transaction(store, mode, mode === "readwrite" ? { durability: "strict" } : undefined);
  const done = new Promise((resolve, reject) => {
    t.oncomplete = () => resolve();
    t.onabort = () => reject(t.error || new Error("IndexedDB transaction aborted"));
    t.onerror = () => reject(t.error);
  });
  const result = await body(t.objectStore(store));
  await done;
  return result;
}

/** The string stored under `key`, or undefined (None in Python). */
export function get(store, key) {
  return tx(store, "readonly", (s) => request(s.get(key)));
}

/** Store a string under `key`; resolves once the write is durable. */
export function put(store, key, value) {
  if (typeof value !== "string") throw new TypeError("demo_idb.put stores strings only");
  return tx(store, "readwrite", (s) => request(s.put(value, key)));
}

/** Append a string to an auto-increment store (the effects ledger). */
export function append(store, value) {
  if (typeof value !== "string") throw new TypeError("demo_idb.append stores strings only");
  return tx(store, "readwrite", (s) => request(s.add(value)));
}

export function remove(store, key) {
  return tx(store, "readwrite", (s) => request(s.delete(key)));
}

/** All keys of a store, sorted (IndexedDB orders string keys by code unit). */
export function keys(store) {
  return tx(store, "readonly", (s) => request(s.getAllKeys()));
}

/** All values of a store, in key order, as a JSON array text (one round trip for the ledger). */
export async function valuesJson(store) {
  const values = await tx(store, "readonly", (s) => request(s.getAll()));
  return JSON.stringify(values);
}

/** Delete everything the demo stored (the "Reset demo" button). */
export async function clearAll() {
  for (const name of STORES) await tx(name, "readwrite", (s) => request(s.clear()));
}
