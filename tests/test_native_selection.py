"""DURABLE_AGENT_NATIVE=auto|0|1|anything else, each in a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.host_only("starts subprocesses")

ROOT = Path(__file__).resolve().parent.parent


# Runs `prelude`, imports durable_agent, and prints what was selected (or the error). Which kernels the public
# codec runs is seen from outside: a spy on the extension module's `encode` (the codec calls the active
# kernels' function at each call) counts the calls that reach it.
PROBE = """
import json, sys, warnings
{prelude}
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    try:
        import durable_agent
        from durable_agent.backends import decode, encode
    except Exception as exc:
        print(json.dumps({{"error": type(exc).__name__, "message": str(exc)}}))
        raise SystemExit(0)
extension, reached = sys.modules.get("durable_agent_native"), []
if extension is not None and callable(getattr(extension, "encode", None)):
    real = extension.encode
    extension.encode = lambda value: reached.append(value) or real(value)
round_trip = decode(encode({{"b": b"x"}})) == {{"b": b"x"}}
print(json.dumps({{
    "native": durable_agent.NATIVE,
    "kernels": "durable_agent_native" if reached else "pure",
    "imported": extension is not None,
    "warnings": [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)],
    "round_trip": round_trip,
}}))
"""

FAKE_OLD = """
import types
fake = types.ModuleType("durable_agent_native")
fake.__version__ = "0.0.1"
sys.modules["durable_agent_native"] = fake
"""

VERSION = (ROOT / "python" / "durable_agent" / "_version.py").read_text().split('"')[-2]

FAKE_INCOMPLETE = f"""
import types
fake = types.ModuleType("durable_agent_native")
fake.__version__ = {VERSION!r}
fake.encode = fake.decode = lambda value: value
sys.modules["durable_agent_native"] = fake
"""

MISSING = 'sys.modules["durable_agent_native"] = None  # makes the import fail'


def probe(mode: str | None, prelude: str = "") -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != "DURABLE_AGENT_NATIVE"}
    if mode is not None:
        env["DURABLE_AGENT_NATIVE"] = mode
    env["PYTHONPATH"] = str(ROOT / "python") + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(prelude=prelude)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _native_installed() -> bool:
    return (
        subprocess.run([sys.executable, "-c", "import durable_agent_native"], capture_output=True).returncode
        == 0
    )


@pytest.fixture(scope="module")
def native_installed() -> bool:
    if os.environ.get("DURABLE_AGENT_NATIVE", "auto") == "0":
        pytest.skip("native kernels disabled by DURABLE_AGENT_NATIVE=0")
    assert _native_installed(), "the native extension is not installed: run scripts/build-native"
    return True


def test_zero_never_imports_the_extension() -> None:
    result = probe("0")
    assert result["native"] is False
    assert result["kernels"] == "pure"
    assert result["imported"] is False
    assert result["round_trip"] is True


@pytest.mark.parametrize("mode", ["yes", "true", "2", "native", "AUTO", "01"])
def test_anything_else_is_a_configuration_error(mode: str) -> None:
    result = probe(mode)
    assert result["error"] == "ConfigurationError"
    assert "DURABLE_AGENT_NATIVE" in str(result["message"])


@pytest.mark.parametrize("mode", [None, "auto", "", "1"])
def test_installed_extension_is_used(native_installed: bool, mode: str | None) -> None:
    result = probe(mode)
    assert result["native"] is True
    assert result["kernels"] == "durable_agent_native"
    assert result["warnings"] == []
    assert result["round_trip"] is True


def test_auto_falls_back_when_missing() -> None:
    result = probe("auto", MISSING)
    assert result["native"] is False
    assert result["kernels"] == "pure"
    assert result["warnings"] == []


def test_one_fails_loudly_when_missing() -> None:
    result = probe("1", MISSING)
    assert result["error"] == "FeatureUnavailableError"
    assert "not installed" in str(result["message"])


@pytest.mark.parametrize("prelude", [FAKE_OLD, FAKE_INCOMPLETE], ids=["mismatched", "incomplete"])
def test_auto_warns_and_falls_back_on_a_bad_extension(prelude: str) -> None:
    result = probe("auto", prelude)
    assert result["native"] is False
    assert result["kernels"] == "pure"
    assert len(result["warnings"]) == 1  # type: ignore[arg-type]


@pytest.mark.parametrize("prelude", [FAKE_OLD, FAKE_INCOMPLETE], ids=["mismatched", "incomplete"])
def test_one_fails_loudly_on_a_bad_extension(prelude: str) -> None:
    result = probe("1", prelude)
    assert result["error"] == "FeatureUnavailableError"
    assert "durable_agent_native" in str(result["message"])


def test_the_installed_extension_reports_this_version(native_installed: bool) -> None:
    import durable_agent_native
    from durable_agent import __version__

    assert durable_agent_native.__version__ == __version__


# The kernel seam (docs/codec.md, docs/tokens.md): the functions the pure kernels and the extension both provide,
# with their parameters. The pure side is held to it by mypy (`_kernels.Kernels`, which the selected module must
# satisfy); the extension by this test and by stubtest against its stub.
KERNEL_SEAM = {
    "b64url_decode": ["text"], "b64url_encode": ["data"], "decode": ["text"], "encode": ["value"],
    "hmac_sha256": ["key", "message"], "token_open": ["token", "key"], "token_sign": ["key", "payload"],
    "token_verify": ["token", "key"],
}


def test_native_kernels_have_the_seams_signatures(native_installed: bool) -> None:
    import inspect

    import durable_agent_native

    found = {name: list(inspect.signature(getattr(durable_agent_native, name)).parameters) for name in KERNEL_SEAM}
    assert found == KERNEL_SEAM


def test_versions_are_locked_exactly() -> None:
    """The pure package, the native distribution and the crate carry one version."""
    import tomllib

    native_project = tomllib.loads((ROOT / "rust" / "pyproject.toml").read_text())["project"]
    workspace = tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]["package"]
    assert native_project["name"] == "durable-agent-native"
    assert native_project["version"] == workspace["version"] == VERSION
