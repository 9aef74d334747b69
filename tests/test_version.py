"""The version is written where each tool reads it; `scripts/set-version` writes them all, and this test refuses a mismatch."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.host_only("reads the project files beside the package")


def test_every_place_names_the_same_version() -> None:
    from durable_agent import __version__

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    workspace = tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]["package"]
    native = tomllib.loads((ROOT / "rust" / "pyproject.toml").read_text())["project"]
    lock = re.search(r'name = "durable-agent-native"\nversion = "([^"]+)"', (ROOT / "Cargo.lock").read_text())
    places = {
        "python/durable_agent/_version.py": __version__,
        "pyproject.toml [project] version": project["version"],
        "pyproject.toml native extra": project["optional-dependencies"]["native"][0].split("==")[1],
        "Cargo.toml [workspace.package] version": workspace["version"],
        "rust/pyproject.toml [project] version": native["version"],
        "Cargo.lock durable-agent-native": lock.group(1) if lock else None,
    }
    assert len(set(places.values())) == 1, f"run scripts/set-version: {places}"
