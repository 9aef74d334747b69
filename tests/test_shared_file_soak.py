"""The README's server setup on one SQLite file, with the CLI, a second server and a worker on it, and SIGKILLs.

The soak itself and what each check means: tests/shared_file_soak.py; benches/soak_shared_file.py runs it longer.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared_file_soak import ROUNDS, Soak

pytestmark = [
    pytest.mark.host_only("starts uvicorn servers, CLI and worker processes and kills them"),
    pytest.mark.kernel_independent,  # its subject: processes and SIGKILLs on one file (the rule: pyproject.toml)
]


def test_nothing_acknowledged_is_lost_on_one_shared_sqlite_file(tmp_path: Path) -> None:
    found = Soak(tmp_path).run(cycles=1)
    assert found.failures == {}, json.dumps(found.failures, indent=1)
    assert found.kills == 3 and found.runs == 2 + len(ROUNDS)
