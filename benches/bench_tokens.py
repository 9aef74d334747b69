"""Approval tokens: sign and verify time per token, against anchors measured in the same run.

Anchors: one raw ``hmac.digest`` call over our token's signed text (the floor for a pure-Python
token: it cannot be cheaper than its MAC; the native kernel, which skips Python's OpenSSL call
overhead, can), itsdangerous ``URLSafeTimedSerializer`` and PyJWT HS256 carrying the same
payload. Every figure is the best of several repeats, in microseconds per token; every ratio
is against anchors timed in the same process, right alongside (so ratios compare across
machines, and survive a machine whose load drifts between tables).

Run: ``.venv/bin/python benches/bench_tokens.py`` (needs ``pip install itsdangerous PyJWT``).
One table per kernel selection: the one the environment selects and, when that is the native
extension, the pure kernels again in a child process (``DURABLE_AGENT_NATIVE=0``; the selector
is read once, at import). The "kernels only" rows time each implementation's token_sign and
token_verify directly.
"""

from __future__ import annotations

import hmac
import importlib
import os
import subprocess
import sys
import timeit
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))

from durable_agent import (
    NATIVE,
    ApprovalSigner,
    ToolApprovalRequest,
    _pure,
)

SECRET = "bench-secret-0123456789-abcdefghijklmnopqrstuvwxyz"
MAX_AGE_MS = 3_600_000
REPEATS = 7
CHILD_FLAG = "--pure-child"
REQUEST = ToolApprovalRequest(
    approval_id="appr_01HZX3K9Q4",
    tool_call_id="toolu_01A09q90qw90lq917835lq9",
    tool_name="write_file",
    input={"path": "/srv/reports/q3.md", "content": "Quarterly report. " * 12, "overwrite": True},
)
FLOOR = "hmac.digest floor"
ITSDANGEROUS = "itsdangerous URLSafeTimedSerializer"

Row = tuple[str, float, float]  # name, sign us, verify us


def per_call_us(fn: Callable[[], Any]) -> float:
    """Best-of-REPEATS time of one call, in microseconds (loop count calibrated to ~0.2 s)."""
    timer = timeit.Timer(fn)
    number, _ = timer.autorange()
    return min(timer.repeat(repeat=REPEATS, number=number)) / number * 1e6


def optional(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def measure() -> tuple[list[Row], int]:
    """Every row of one table (anchors included), and our token's length."""
    signer = ApprovalSigner(SECRET)
    token = signer.sign(REQUEST, run_id="run-42")
    assert signer.verify(token, max_age_ms=MAX_AGE_MS) is not None
    payload = {**REQUEST.to_dict(), "run_id": "run-42"}
    key = SECRET.encode()
    signed_text = token[: token.rfind(".")].encode()

    floor = per_call_us(lambda: hmac.digest(key, signed_text, "sha256"))
    rows: list[Row] = [(FLOOR, floor, floor)]
    rows.append(
        (
            f"durable-agent ApprovalSigner ({'native' if NATIVE else 'pure'} kernels)",
            per_call_us(lambda: signer.sign(REQUEST, run_id="run-42")),
            per_call_us(lambda: signer.verify(token, max_age_ms=MAX_AGE_MS)),
        )
    )

    kernel_modules: list[tuple[str, ModuleType]] = [("pure", _pure)]
    native = optional("durable_agent_native") if NATIVE else None
    if native is not None:
        kernel_modules.append(("native", native))
    payload_text = _pure.encode({**payload, "issued_at": 0, "kid": signer.key_id})
    for label, mod in kernel_modules:
        sign_kernel, verify_kernel = mod.token_sign, mod.token_verify
        rows.append(
            (
                f"  kernels only, token_sign/token_verify ({label})",
                per_call_us(lambda: sign_kernel(key, payload_text)),
                per_call_us(lambda: verify_kernel(token, key)),
            )
        )

    itsdangerous = optional("itsdangerous")
    if itsdangerous is not None:
        serializer = itsdangerous.URLSafeTimedSerializer(SECRET, salt="approval")
        its_token = serializer.dumps(payload)
        assert serializer.loads(its_token, max_age=MAX_AGE_MS // 1000) == payload
        rows.append(
            (
                ITSDANGEROUS,
                per_call_us(lambda: serializer.dumps(payload)),
                per_call_us(lambda: serializer.loads(its_token, max_age=MAX_AGE_MS // 1000)),
            )
        )
    jwt = optional("jwt")
    if jwt is not None:
        claims = {**payload, "iat": 1_700_000_000}
        jwt_token = jwt.encode(claims, SECRET, algorithm="HS256")
        assert jwt.decode(jwt_token, SECRET, algorithms=["HS256"])["tool_name"] == "write_file"
        rows.append(
            (
                "PyJWT HS256",
                per_call_us(lambda: jwt.encode(claims, SECRET, algorithm="HS256")),
                per_call_us(lambda: jwt.decode(jwt_token, SECRET, algorithms=["HS256"])),
            )
        )
    return rows, len(token)


def print_table(title: str, rows: list[Row]) -> None:
    anchors = {name: (sign_us, verify_us) for name, sign_us, verify_us in rows}
    floor = anchors[FLOOR][0]
    its = anchors.get(ITSDANGEROUS)
    print(title)
    header = f"{'':60} {'sign us':>8} {'verify us':>10} {'sign/floor':>11} {'verify/floor':>13}"
    if its:
        header += f" {'sign/itsd':>10} {'verify/itsd':>12}"
    print(header)
    for name, sign_us, verify_us in rows:
        line = f"{name:60} {sign_us:8.2f} {verify_us:10.2f} {sign_us / floor:11.1f} {verify_us / floor:13.1f}"
        if its:
            line += f" {sign_us / its[0]:10.2f} {verify_us / its[1]:12.2f}"
        print(line)
    if its is None:
        print("itsdangerous not installed: no itsdangerous anchor (pip install itsdangerous PyJWT)")
    if not any(name == "PyJWT HS256" for name, _, _ in rows):
        print("PyJWT not installed: no PyJWT anchor")


def main() -> None:
    rows, length = measure()
    if CHILD_FLAG in sys.argv[1:]:
        print_table("pure kernels (DURABLE_AGENT_NATIVE=0, child process)", rows)
        return
    print(f"token length: {length} chars; Python {sys.version.split()[0]}")
    print_table(f"{'native' if NATIVE else 'pure'} kernels (as selected)", rows)
    if NATIVE:
        print(flush=True)
        env = {**os.environ, "DURABLE_AGENT_NATIVE": "0"}
        subprocess.run([sys.executable, __file__, CHILD_FLAG], env=env, check=True)


if __name__ == "__main__":
    main()
