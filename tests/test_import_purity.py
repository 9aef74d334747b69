"""`import durable_agent` uses only the standard library and no entropy, and `__all__` is honest."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

# Where `durable_agent` is imported from: the source tree's python/, or site-packages for an installed wheel.
PYTHON_DIR = Path(importlib.util.find_spec("durable_agent").origin).parent.parent  # type: ignore[union-attr, arg-type]


@pytest.mark.host_only("runs a fresh interpreter in a subprocess")
def test_importing_the_package_pulls_in_only_the_standard_library() -> None:
    probe = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import durable_agent\n"
        "extra = sorted({m.split('.')[0] for m in set(sys.modules) - before}\n"
        "               - set(sys.stdlib_module_names) - {'durable_agent', 'durable_agent_native'})\n"
        "print(','.join(extra))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                          cwd=PYTHON_DIR, env={"PYTHONPATH": str(PYTHON_DIR), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""


def test_all_is_sorted_unique_and_importable() -> None:
    import durable_agent

    names = list(durable_agent.__all__)
    assert names == sorted(names) and len(set(names)) == len(names)
    for name in names:
        assert hasattr(durable_agent, name), name
    public = {n for n in vars(durable_agent) if not n.startswith("_") and not isinstance(getattr(durable_agent, n), type(sys))}
    assert public - {"annotations"} <= set(names), public - set(names)
