"""Progress in logs (stdout not a terminal): one line per 10 % with rate and ETA, checked against a fake clock."""

from __future__ import annotations

from msb.cli.progress import format_line, progress_lines


def test_one_line_per_ten_percent_with_rate_and_eta():
    done = [0]  # items the consumer has finished; each takes 0.5 s on the fake clock
    lines: list[str] = []
    items = []
    for x in progress_lines(range(20), "evaluating", 20, lines.append, clock=lambda: 0.5 * done[0],
                                min_interval_s=0.0):
        items.append(x)
        done[0] += 1
    assert items == list(range(20))
    # every 2 items (10 % of 20): done k, elapsed 0.5 k s -> 2.0 it/s, ETA (20 - k) / 2 s
    assert lines == [f"evaluating: {k}/20 ({5 * k} %), 2.0 it/s, ETA {(20 - k) / 2:.0f} s" for k in range(2, 21, 2)]
    assert format_line("x", 0, 7, 0.0) == "x: 0/7 (0 %), 0.0 it/s, ETA ?"


def test_short_work_still_reports_its_end():
    lines: list[str] = []
    clock = iter([0.0, 1.0, 2.0, 3.0])
    list(progress_lines("abc", "batches", 3, lines.append, clock=lambda: next(clock), min_interval_s=1.5))
    # 1 s per item, at most one line per 1.5 s: item 1 (1 s) silent, item 2 (2 s) shown, item 3 (the end) shown
    assert lines == ["batches: 2/3 (67 %), 1.0 it/s, ETA 1 s", "batches: 3/3 (100 %), 1.0 it/s, ETA 0 s"]
    lines.clear()
    fast = iter([0.0, 0.1, 0.2, 0.3])
    list(progress_lines("abc", "batches", 3, lines.append, clock=lambda: next(fast)))
    assert lines == []  # 0.3 s in all: no progress line
