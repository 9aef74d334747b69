"""One tree's side of `bench_loop.py --against`: times no-store runs on request, in its own process.

    python benches/_loop_worker.py <dir holding durable_agent>

Reads lines ``<face> <steps> <runs>`` (face: ``generate`` or ``agent``) from stdin and answers each
with the best seconds per step of `runs` runs; its first line names the `durable_agent` it imported
and the kernel in use, so the caller can check it measures the tree it meant to.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, sys.argv[1])
sys.path.insert(1, str(Path(__file__).resolve().parent))

from _loop_agent import agent_run, generate_run

import durable_agent

FACES = {"generate": generate_run, "agent": agent_run}


def main() -> None:
    print(durable_agent.__file__, durable_agent.NATIVE, flush=True)
    for line in sys.stdin:
        face, steps, runs = line.split()
        best = float("inf")
        for _ in range(int(runs)):
            start = time.perf_counter()
            asyncio.run(FACES[face](int(steps)))
            best = min(best, time.perf_counter() - start)
        print(best / int(steps), flush=True)


if __name__ == "__main__":
    main()
