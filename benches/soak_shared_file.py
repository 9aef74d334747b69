"""Shared-file soak: the README's server setup on one SQLite file, with two servers, the CLI and a worker on it,
and SIGKILLs: tests/test_shared_file_soak.py at a larger scale (see tests/shared_file_soak.py for the rounds and
the checks). Prints what was done and found; exits non-zero when any check failed.

    .venv/bin/python benches/soak_shared_file.py [--cycles 10] [--worker-prompts 20]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from shared_file_soak import ROUNDS, Soak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=10, help=f"times each of the {len(ROUNDS)} rounds is played")
    parser.add_argument("--worker-prompts", type=int, default=20, help="runs of each torture worker session")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        found = Soak(Path(tmp), worker_prompts=args.worker_prompts).run(args.cycles)
    print(f"{found.runs} runs over HTTP, {found.kills} server SIGKILLs, {found.cli_calls} CLI calls, "
          f"{found.seconds:.0f} s")
    if found.failures:
        print("FAILED:", json.dumps(found.failures, indent=1))
        return 1
    print("nothing lost, nothing pruned left behind, no effect twice, no I/O error")
    return 0


if __name__ == "__main__":
    sys.exit(main())
