"""Shared helpers of the ``scripts/bench_*.py`` benchmarks: interleaved repeats and the printed comparison.

Every benchmark times *our* path and each competitor on the same work in one process, interleaving the
repeats (ours, competitor 1, competitor 2, ours, ...) so that a load change on the shared machine hits every
side alike, and reports median / min / max seconds per side, the time ratio ours / best competitor (< 1:
ours is faster) and a value check (the values both sides computed are equal, within a stated tolerance).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Row:
    """One benchmark row: the work, the sides' times (seconds, one per repeat) and the value check."""

    work: str
    times: dict[str, list[float]] = field(default_factory=dict)
    check: str = ""
    equal: bool = True
    notes: list[str] = field(default_factory=list)

    def stats(self, side: str) -> tuple[float, float, float]:
        """``(median, min, max)`` seconds of one side."""
        t = np.asarray(self.times[side])
        return float(np.median(t)), float(t.min()), float(t.max())

    def ratio(self) -> float:
        """Median time of ``ours`` over the smallest median among the competitors (NaN without one)."""
        others = [self.stats(s)[0] for s in self.times if s != "ours"]
        return self.stats("ours")[0] / min(others) if others else float("nan")

    def as_dict(self) -> dict:
        """JSON-ready summary."""
        return {"work": self.work, "check": self.check, "equal": self.equal, "ratio": self.ratio(),
                "notes": self.notes,
                "sides": {s: dict(zip(("median_s", "min_s", "max_s"), self.stats(s))) for s in self.times}}


def interleave(row: Row, sides: dict[str, Callable[[], object]], repeats: int) -> dict[str, object]:
    """Run every side ``repeats`` times, interleaved; store the times in ``row``; return each side's last value."""
    values: dict[str, object] = {}
    for _ in range(repeats):
        for name, fn in sides.items():
            t0 = time.perf_counter()
            values[name] = fn()
            row.times.setdefault(name, []).append(time.perf_counter() - t0)
    return values


def print_row(row: Row) -> None:
    """Print one row: each side's median [min, max], the ratio ours / best competitor, the value check."""
    print(f"== {row.work}")
    for side in row.times:
        med, lo, hi = row.stats(side)
        print(f"   {side:<34} median {med:9.4f} s  [min {lo:.4f}, max {hi:.4f}]  n={len(row.times[side])}")
    r = row.ratio()
    verdict = "no competitor run" if r != r else "ours faster" if r < 1 else "ours SLOWER"
    print(f"   ratio ours / best competitor: {r:.2f}  ({verdict})")
    print(f"   value check: {row.check}: {'EQUAL' if row.equal else 'DIFFERENT'}")
    for n in row.notes:
        print(f"   note: {n}")
