"""Crash soak: hundreds of SIGKILLs per backend, with the crash torture's supervisor and independent checks.

The same workers, kill windows and checks as tests/test_crash_journal.py (see
tests/torture_supervisor.py), at the scale users hit: by default 16 sessions of 30 runs each,
4 worker processes, 500 kills per backend. Prints what was done and found, and exits non-zero
when any check failed. Postgres runs when DURABLE_AGENT_TEST_POSTGRES_URL is set (for example
under ``scripts/services run --``).

    .venv/bin/python benches/soak_crash.py [--kills 500] [--sessions 16] [--prompts 30] [--backends sqlite,postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import torture_supervisor
import torture_worker


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=500)
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--prompts", type=int, default=30)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--backends", default="sqlite,postgres")
    args = parser.parse_args()
    sessions = [f"account-{i}" for i in range(args.sessions)]
    failed = False
    for name in args.backends.split(","):
        if name == "postgres" and not os.environ.get("DURABLE_AGENT_TEST_POSTGRES_URL"):
            print("postgres: skipped (DURABLE_AGENT_TEST_POSTGRES_URL is not set)")
            continue
        with tempfile.TemporaryDirectory() as tmp, torture_worker.journal_spec(name, Path(tmp), "soak") as spec:
            ledger = Path(tmp) / "ledger.jsonl"
            tally = torture_supervisor.supervise(spec, ledger, sessions=sessions, prompts=args.prompts,
                                                 workers=args.workers, kills=args.kills, seed=args.seed,
                                                 deadline_s=5_400)
            found = asyncio.run(torture_supervisor.check(spec, ledger, sessions, args.prompts))
        finished = args.sessions - len(found.unfinished)
        print(f"{name}: {tally.total_kills} SIGKILLs ({', '.join(f'{k} {v}' for k, v in sorted(tally.kills.items()))}),"
              f" {tally.stalls} stalls, {tally.seconds:.0f} s")
        print(f"  sessions that finished all {args.prompts} runs: {finished} / {args.sessions}")
        print(f"  model requests: {found.model_requests} for {found.model_steps} model steps;"
              f" finished model calls requested again: {len(found.repeated_model_calls)}")
        print(f"  duplicate unsafe effects: {len(found.duplicate_effects)}; transcripts with a duplicated final"
              f" answer: {len(found.duplicated_answers)}; transcripts unlike an uncrashed run:"
              f" {len(found.wrong_transcripts)}")
        print(f"  unsafe calls reported interrupted: {found.interrupted}; claims refused: {found.refused}; "
              f"torn ledger lines: {found.torn}")
        if found.failures:
            print(f"  FAILED: {found.failures}")
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
