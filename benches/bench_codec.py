"""Benchmark: the checkpoint codec and the token verifier, native against pure and the anchors.

Run: ``scripts/venv && scripts/build-native && .venv/bin/pip install -r benches/requirements.txt``
then ``.venv/bin/python benches/bench_codec.py [--quick]``.

``benches/bench_codec.py --pyodide [--quick]`` runs the edge figures instead: this file inside
Pyodide 314, then 0.28, in Node (``pyodide/run-python.mjs``; ``npm ci`` in pyodide/ first), where
the pure codec is timed side by side with the anchors a Worker could use instead and printed as
ratios: ``json.dumps`` with a bytes hook, plain ``json.loads`` (which neither decodes the base64
nor checks anything), and ``json.loads`` with an object hook that gives the bytes back.
Two more decode rows are lower bounds, not codecs: the pure decode's own pieces without the
per-object hook that counts keys (duplicate keys), and without the measure of the text (depth).

Everything is measured side by side in this one run and printed as MB/s and as ratios; there
are no absolute thresholds (the machine is shared). Anchors that are not installed are reported
as missing, never silently dropped.

Fixture: a coding-agent checkpoint with 10, 100 and 1,000 steps: each step is an assistant
message with a tool call (JSON input) and a tool message with a text result; every 10th result
is a 16 KiB binary image. MB/s is always *our encoded text's size* divided by the time, so every
row of one fixture describes the same workload.

The lossless anchors (stdlib json, orjson, msgspec-json) get the Python pass a user would write
today to keep bytes and reserved-key dicts intact (`tag` before encoding, `untag` after
decoding); msgspec-msgpack and LangGraph's JsonPlusSerializer carry bytes natively.
"""

from __future__ import annotations

import argparse
import base64
import gc
import hashlib
import hmac
import json
import os
import random
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))

from durable_agent import _pure  # noqa: E402

try:
    import durable_agent_native as native
except ImportError:  # the pure-only numbers are still useful
    native = None


# --- fixture -------------------------------------------------------------------------------

WORDS = "the of and to in is that for it as with was on be by this are from at or an def return self import".split()


def _prose(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def checkpoint(steps: int, seed: int = 7) -> dict[str, Any]:
    """A realistic coding-agent checkpoint with `steps` model+tool steps."""
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful coding agent. " + _prose(rng, 60)},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Fix the failing test in src/app.py \u2014 " + _prose(rng, 30)}
            ],
        },
    ]
    for i in range(steps):
        call_id = f"call_{i:05d}_{rng.getrandbits(32):08x}"
        tool = rng.choice(["read_file", "grep", "run_tests", "edit_file", "screenshot"])
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": _prose(rng, rng.randint(5, 40))},
                    {
                        "type": "tool-call",
                        "tool_call_id": call_id,
                        "tool_name": tool,
                        "input": {
                            "path": f"src/module_{rng.randint(0, 50)}/file_{i}.py",
                            "pattern": rng.choice(["def main", "TODO", "assert x == 1", "\u00fcber"]),
                            "options": {
                                "context": rng.randint(0, 5),
                                "case_sensitive": rng.random() < 0.5,
                                "timeout_s": round(rng.uniform(0.5, 30.0), 3),
                            },
                            "lines": [rng.randint(1, 500) for _ in range(rng.randint(0, 6))],
                        },
                    },
                ],
            }
        )
        if i % 10 == 9:
            output: Any = {"type": "image", "data": rng.randbytes(16 * 1024), "media_type": "image/png"}
        else:
            output = "\n".join(
                f"{n:4d}  {_prose(rng, rng.randint(3, 14))}" for n in range(rng.randint(5, 40))
            )
        messages.append(
            {
                "role": "tool",
                "content": [
                    {
                        "type": "tool-result",
                        "tool_call_id": call_id,
                        "tool_name": tool,
                        "output": output,
                        "is_error": rng.random() < 0.05,
                    }
                ],
            }
        )
    return {
        "version": 1,
        "run_id": f"run_{seed}",
        "step_id": f"step_{steps}",
        "step_index": steps,
        "status": "running",
        "messages": messages,
        "usage": {"input_tokens": 1234 * steps, "output_tokens": 321 * steps, "total_tokens": 1555 * steps},
        "pending_approvals": [],
        "agent_path": None,
        "created_at": 1_700_000_000_000 + steps,
    }


# --- the lossless tagging pass a user would write around a plain JSON library ----------------

RESERVED = ("$bytes", "$esc")


def tag(value: Any) -> Any:
    if isinstance(value, dict):
        out = {k: tag(v) for k, v in value.items()}
        return {"$esc": out} if len(out) == 1 and next(iter(out)) in RESERVED else out
    if isinstance(value, (list, tuple)):
        return [tag(v) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$bytes": base64.b64encode(value).decode("ascii")}
    return value


def untag(value: Any) -> Any:
    if isinstance(value, dict):
        if len(value) == 1:
            key, inner = next(iter(value.items()))
            if key == "$bytes":
                return base64.b64decode(inner)
            if key == "$esc":
                ((k, v),) = inner.items()
                return {k: untag(v)}
        return {k: untag(v) for k, v in value.items()}
    if isinstance(value, list):
        return [untag(v) for v in value]
    return value


# --- timing --------------------------------------------------------------------------------


GC_OFF = False


def best_times(fns: dict[str, Callable[[], Any]], rounds: int) -> dict[str, float]:
    """Seconds per call of each function: the fastest of `rounds` timed batches (~20 ms each).

    The batches are interleaved (one batch of every function per round), so a burst of load
    from elsewhere on a shared machine slows every implementation alike instead of one, and
    each round starts with another function: under Pyodide the first batch after the round's
    `gc.collect()` pays ~10 ms more (measured: json.loads of the 1,000-step checkpoint, 14 ms
    after another batch, 24-28 ms right after the collection), which a fixed order would
    charge to one function every time. The cyclic GC stays on (a server runs with it;
    building many containers triggers it) unless `--gc-off` asks for timeit-style numbers.
    """
    numbers: dict[str, int] = {}
    for name, fn in fns.items():
        fn()
        start = time.perf_counter()
        fn()
        once = max(time.perf_counter() - start, 1e-7)
        numbers[name] = max(1, int(0.02 / once))
    best = dict.fromkeys(fns, float("inf"))
    names = list(fns)
    if GC_OFF:
        gc.disable()
    try:
        for round_ in range(rounds):
            gc.collect()
            turn = round_ % len(names)
            for name in names[turn:] + names[:turn]:
                fn, number = fns[name], numbers[name]
                start = time.perf_counter()
                for _ in range(number):
                    fn()
                best[name] = min(best[name], (time.perf_counter() - start) / number)
    finally:
        gc.enable()
    return best


def codec_rows(value: Any, text: str) -> list[tuple[str, Callable[[], Any], Callable[[], Any]]]:
    """(name, encode, decode) for every implementation and installed anchor."""
    rows: list[tuple[str, Callable[[], Any], Callable[[], Any]]] = []
    if native is not None:
        rows.append(("durable-agent native", lambda: native.encode(value), lambda: native.decode(text)))
    rows.append(("durable-agent pure", lambda: _pure.encode(value), lambda: _pure.decode(text)))
    dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
    rows.append(("stdlib json + tag pass", lambda: dumps(tag(value)), lambda: untag(json.loads(text))))
    try:
        import orjson

        rows.append(
            ("orjson + tag pass", lambda: orjson.dumps(tag(value)), lambda: untag(orjson.loads(text)))
        )
    except ImportError:
        rows.append(("orjson + tag pass", None, None))  # type: ignore[arg-type]
    try:
        import msgspec

        mj_enc, mj_dec = msgspec.json.Encoder(), msgspec.json.Decoder()
        rows.append(
            ("msgspec-json + tag pass", lambda: mj_enc.encode(tag(value)), lambda: untag(mj_dec.decode(text)))
        )
        mp_enc, mp_dec = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder()
        packed = mp_enc.encode(value)
        rows.append(
            ("msgspec-msgpack (bytes native)", lambda: mp_enc.encode(value), lambda: mp_dec.decode(packed))
        )
    except ImportError:
        rows.append(("msgspec", None, None))  # type: ignore[arg-type]
    try:
        from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

        serde = JsonPlusSerializer()
        typed = serde.dumps_typed(value)
        rows.append(
            (
                "LangGraph JsonPlusSerializer",
                lambda: serde.dumps_typed(value),
                lambda: serde.loads_typed(typed),
            )
        )
    except ImportError:
        rows.append(("LangGraph JsonPlusSerializer", None, None))  # type: ignore[arg-type]
    return rows


def bench_codec(steps_list: list[int], rounds: int) -> None:
    for steps in steps_list:
        value = checkpoint(steps)
        text = _pure.encode(value)
        if native is not None:
            assert native.encode(value) == text, "native and pure disagree on the fixture"
        megabytes = len(text.encode("utf-8")) / 1e6
        print(f"\n## codec, {steps} steps: encoded text {megabytes * 1000:.1f} kB")
        print(f"{'implementation':34} {'encode MB/s':>12} {'decode MB/s':>12} {'round trip MB/s':>16}")
        rows = codec_rows(value, text)
        fns: dict[str, Callable[[], Any]] = {}
        for name, enc, dec in rows:
            if enc is not None:
                fns[f"{name}/encode"], fns[f"{name}/decode"] = enc, dec
        timed = best_times(fns, rounds)
        times: dict[str, tuple[float, float]] = {}
        for name, enc, _ in rows:
            if enc is None:
                print(f"{name:34} {'not installed':>12}")
                continue
            t_enc, t_dec = timed[f"{name}/encode"], timed[f"{name}/decode"]
            times[name] = (t_enc, t_dec)
            print(
                f"{name:34} {megabytes / t_enc:12.1f} {megabytes / t_dec:12.1f} {megabytes / (t_enc + t_dec):16.1f}"
            )
        if "durable-agent native" in times:
            n_enc, n_dec = times["durable-agent native"]
            print("native speed-up (x times faster than):")
            for name, (t_enc, t_dec) in times.items():
                if name != "durable-agent native":
                    print(
                        f"  {name:32} encode {t_enc / n_enc:6.2f}x  decode {t_dec / n_dec:6.2f}x"
                        f"  round trip {(t_enc + t_dec) / (n_enc + n_dec):6.2f}x"
                    )


def bench_tokens(rounds: int) -> None:
    key = b"durable-agent bench secret: 0123456789abcdef0123456789abcdef"
    payload = json.dumps(
        {
            "approval_id": "appr_123",
            "tool_call_id": "call_00042_deadbeef",
            "tool_name": "delete_file",
            "input": {"path": "/tmp/a.txt", "force": True},
            "run_id": "run_7",
            "issued_at": 1_700_000_000_000,
            "kid": "yWX57ofw",
        },
        separators=(",", ":"),
    )
    token = _pure.token_sign(key, payload)
    body = token[: token.rfind(".")].encode("ascii")
    print(f"\n## token verify ({len(token)}-character token)")
    rows: list[tuple[str, Callable[[], Any]]] = [
        ("raw hmac.digest (anchor)", lambda: hmac.digest(key, body, "sha256"))
    ]
    if native is not None:
        assert native.token_verify(token, key) == payload
        rows.append(("durable-agent native token_verify", lambda: native.token_verify(token, key)))
    rows.append(("durable-agent pure token_verify", lambda: _pure.token_verify(token, key)))
    try:
        import itsdangerous

        signer = itsdangerous.Signer(key, digest_method=hashlib.sha256)
        signed = signer.sign(payload.encode())
        rows.append(("itsdangerous Signer.unsign (sha256)", lambda: signer.unsign(signed)))
    except ImportError:
        print("itsdangerous: not installed")
    try:
        import jwt

        jwt_token = jwt.encode(json.loads(payload), key, algorithm="HS256")
        rows.append(
            ("PyJWT decode (HS256, parses JSON)", lambda: jwt.decode(jwt_token, key, algorithms=["HS256"]))
        )
    except ImportError:
        print("PyJWT: not installed")
    times = best_times(dict(rows), rounds)
    anchor = times["raw hmac.digest (anchor)"]
    print(f"{'implementation':38} {'us/call':>9} {'vs hmac.digest':>15}")
    for name, t in times.items():
        print(f"{name:38} {t * 1e6:9.2f} {t / anchor:14.2f}x")
    if native is not None:
        pure_t, native_t = (
            times["durable-agent pure token_verify"],
            times["durable-agent native token_verify"],
        )
        print(
            f"native token_verify is {pure_t / native_t:.2f}x faster than pure, "
            f"{native_t / anchor:.2f}x the time of one hmac.digest"
        )


MEMORY_PROBE = """
import gc, sys
sys.path.insert(0, {python!r})
impl = sys.argv[1]
if impl == "native":
    import durable_agent_native as k
else:
    from durable_agent import _pure as k
def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
text = open({path!r}, encoding="utf-8").read()
k.decode("[1]")
gc.collect()
open("/proc/self/clear_refs", "w").write("5")  # resets the peak RSS (VmHWM) to the current RSS
before = status("VmRSS")
value = k.decode(text)
print(status("VmHWM") - before)
"""


def bench_memory(steps: int) -> None:
    text = _pure.encode(checkpoint(steps))
    size = len(text.encode("utf-8"))
    print(f"\n## memory: decoding the {steps}-step checkpoint ({size / 1e6:.2f} MB of text)")
    print(
        f"{'implementation':24} {'tracemalloc peak':>17} {'/ text':>8} {'RSS peak delta':>15} {'/ text':>8}"
    )
    path = ROOT / ".venv" / "bench-memory-fixture.json"
    path.write_text(text, encoding="utf-8")
    try:
        impls = [("pure", _pure)] + ([("native", native)] if native is not None else [])
        for name, kernels in impls:
            gc.collect()
            tracemalloc.start()
            value = kernels.decode(text)
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            del value
            probe = MEMORY_PROBE.format(python=str(ROOT / "python"), path=str(path))
            done = subprocess.run([sys.executable, "-c", probe, name], capture_output=True, text=True)
            rss = int(done.stdout.strip()) if done.returncode == 0 else -1  # -1: no /proc peak reset here
            print(
                f"{name:24} {peak / 1e6:14.2f} MB {peak / size:7.2f}x {rss / 1e6:12.2f} MB {rss / size:7.2f}x"
            )
    finally:
        path.unlink(missing_ok=True)


def _bytes_hook(value: object) -> dict[str, str]:
    """json.dumps' `default`: the least a plain-json user must write to keep bytes."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$bytes": base64.b64encode(value).decode("ascii")}
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _bytes_object_hook(obj: dict[str, Any]) -> Any:
    """json.loads' `object_hook`: the least a plain-json user must write to get bytes back."""
    if len(obj) == 1 and "$bytes" in obj:
        return base64.b64decode(obj["$bytes"])
    return obj


def _decode_bounds(text: str) -> dict[str, Callable[[], Any]]:
    """Two lower bounds on the pure decode under WebAssembly, made of its own pieces: its work
    without the per-object hook that counts keys (which finds duplicate keys), and without the
    measure of the text (which keeps a deep text from overflowing the stack). Neither is safe to
    use; they show, in the same run, how close to `json.loads` each piece lets the decode get."""
    from durable_agent import _codec_pure as codec

    def cut() -> tuple[str, list[bytes]]:
        pieces = codec._cut_bytes(text)
        assert pieces is not None, "the fixture holds bytes"
        return pieces

    def without_hook() -> Any:
        cut_text, payloads = cut()
        codec._measure(cut_text, payloads)
        return codec._loads(cut_text, constant=codec._constants_giving(payloads))

    def without_measure() -> Any:
        cut_text, payloads = cut()
        return codec._loads_counting_keys(cut_text, payloads)

    return {"bound: no key-count hook": without_hook, "bound: no depth measure": without_measure}


def bench_edge(steps_list: list[int], rounds: int) -> None:
    """The pure codec against the stdlib json it is built on, in this interpreter (Pyodide)."""
    print(f"{'checkpoint':>16} {'operation':<24} {'pure ms':>9} {'json ms':>9} {'ratio':>7}  anchor")
    for steps in steps_list:
        value = checkpoint(steps)
        text = _pure.encode(value)
        assert _pure.decode(text) == value
        bounds = _decode_bounds(text)
        timed = best_times(
            {
                "encode": lambda: _pure.encode(value),
                "dumps": lambda: json.dumps(
                    value, ensure_ascii=False, separators=(",", ":"), default=_bytes_hook
                ),
                "decode": lambda: _pure.decode(text),
                "loads": lambda: json.loads(text),
                "loads+bytes": lambda: json.loads(text, object_hook=_bytes_object_hook),
                **bounds,
            },
            rounds,
        )
        size = f"{steps} steps, {len(text.encode('utf-8')) / 1e6:.1f} MB"
        for op, anchor, anchor_name in (
            ("encode", "dumps", "json.dumps(default=bytes hook)"),
            ("decode", "loads", "json.loads"),
            ("decode", "loads+bytes", "json.loads(object_hook=bytes hook)"),
            *((bound, "loads", "json.loads") for bound in bounds),
        ):
            ours, theirs = timed[op], timed[anchor]
            print(
                f"{size:>16} {op:<24} {ours * 1e3:9.2f} {theirs * 1e3:9.2f} {ours / theirs:6.2f}x  {anchor_name}"
            )


PYODIDE_RUNTIMES = ("314", "028")  # Pyodide 314.0.7 (Python 3.14), 0.28.2 (Python 3.13)


def run_in_pyodide(args: list[str]) -> None:
    """This file again, inside each Pyodide runtime in Node (pyodide/run-python.mjs)."""
    runner = ROOT / "pyodide" / "run-python.mjs"
    code = 0
    for runtime in PYODIDE_RUNTIMES:
        print(f"\n## Pyodide runtime {runtime}", flush=True)
        done = subprocess.run(["node", str(runner), "--runtime", runtime, __file__, *args])
        code = code or done.returncode
    sys.exit(code)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer timing rounds (noisier)")
    parser.add_argument(
        "--gc-off", action="store_true", help="time with the cyclic GC disabled (as timeit does)"
    )
    parser.add_argument(
        "--pyodide",
        action="store_true",
        help="the pure codec against stdlib json inside Pyodide 314 and 0.28",
    )
    args = parser.parse_args()
    global GC_OFF
    GC_OFF = args.gc_off
    rounds = 8 if args.quick else 30
    if args.pyodide and sys.platform != "emscripten":
        run_in_pyodide(sys.argv[1:])
    if sys.platform == "emscripten":
        print(f"Pyodide, Python {sys.version.split()[0]}, cyclic GC {'off' if GC_OFF else 'on'}")
        bench_edge([100, 1000], rounds)
        return
    print(
        f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, cyclic GC {'off' if GC_OFF else 'on'}; native extension: "
        f"{'durable_agent_native ' + native.__version__ if native else 'NOT INSTALLED'}"
    )
    bench_codec([10, 100, 1000], rounds)
    bench_tokens(rounds)
    bench_memory(1000)


if __name__ == "__main__":
    main()
