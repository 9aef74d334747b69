"""Timing and the per-step table shared by the loop and journal benchmarks."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def per_step(steps: int, repeat: int, run: Callable[[], Any]) -> float:
    """Seconds per step of the best of `repeat` runs of `run` (each run takes `steps` steps)."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best / steps


def print_header(width: int, base: str, anchor: str) -> None:
    print(f"{'steps':>6} {'variant':<{width}} {'ms/step':>9} {'vs ' + base:>14} {'vs ' + anchor:>14}")


def print_rows(steps: int, rows: dict[str, float], width: int, base: str, anchor: str) -> None:
    """One line per variant: ms per step, and the ratio to the `base` row and to the `anchor` row."""
    base_value, anchor_value = rows[base], rows.get(anchor)
    for name, value in rows.items():
        versus = f"{value / anchor_value:13.2f}x" if anchor_value else "  (no anchor)"
        print(f"{steps:>6} {name:<{width}} {value * 1000:9.3f} {value / base_value:13.2f}x {versus}")
