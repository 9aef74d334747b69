"""scripts/release-metadata: the README's links and image resolve on the package index, and the project has URLs."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.host_only("runs a script of the repository in a subprocess")

ROOT = Path(__file__).resolve().parent.parent
REPOSITORY = "https://github.com/example-org/durable-agent"


def release(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "release-metadata"), *args, str(root)],
                          capture_output=True, text=True, check=False)


def test_every_relative_link_and_image_of_the_readme_becomes_absolute(tmp_path: Path) -> None:
    for name in ("README.md", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    before = (tmp_path / "README.md").read_text()
    relative = re.findall(r"!?\[[^\]]*\]\(((?![a-z]+:|#)[^)\s]+)\)", before)
    assert relative, "the README links to files of the repository"
    assert release(tmp_path, REPOSITORY, "v1.2.3").returncode == 0

    after = (tmp_path / "README.md").read_text()
    targets = re.findall(r"(!?)\[[^\]]*\]\(([^)\s]+)\)", after)
    assert all(t.startswith(("https://", "http://", "#", "mailto:")) for _, t in targets), targets
    for image, target in targets:
        if target.startswith(REPOSITORY):
            kind, ref, path = target.removeprefix(REPOSITORY + "/").split("/", 2)
            assert (kind, ref) == ("raw" if image else "blob", "v1.2.3")
            assert (ROOT / path).exists(), f"{target} names no file of the repository"
    assert sum(t.startswith(REPOSITORY) for _, t in targets) == len(relative)  # each relative one, nothing else
    urls = tomllib.loads((tmp_path / "pyproject.toml").read_text())["project"]["urls"]
    assert urls["Source"] == REPOSITORY and urls["Issues"] == REPOSITORY + "/issues"
    assert tomllib.loads((tmp_path / "pyproject.toml").read_text())["project"]["name"] == "durable-agent"

    assert release(tmp_path, REPOSITORY, "v1.2.3").returncode == 0  # a second run changes nothing
    assert (tmp_path / "README.md").read_text() == after


def test_a_missing_or_malformed_address_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    for name in ("README.md", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    for args in ((), ("github.com/x/y", "v1"), (REPOSITORY + "/", "v1"), (REPOSITORY, "")):
        done = release(tmp_path, *args)
        assert done.returncode == 2 and "Usage" in done.stderr, args
    assert (tmp_path / "README.md").read_text() == (ROOT / "README.md").read_text()
