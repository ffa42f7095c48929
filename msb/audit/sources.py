"""Source/video ids from file names (``msb audit --group-pattern REGEX``).

A source is what several rows can come from: a video, a patient, a sequence. It comes from the prepared index's
``group`` column, or from the image file name with ``--group-pattern``: the first capture group of
``re.search(REGEX, Path(image_path).name)``; e.g. ``'^(seq\\d+)_'`` gives ``seq3`` for ``seq3_0012.png``.
"""

from __future__ import annotations

import re
from typing import Sequence

from msb.errors import MSBError


def group_regex(pattern: str) -> re.Pattern:
    """Compile a ``--group-pattern``.

    Raises:
        MSBError: not a valid regular expression, or no capture group.
    """
    try:
        rx = re.compile(pattern)
    except re.error as e:
        raise MSBError(f"--group-pattern {pattern!r} is not a valid regular expression ({e}).") from e
    if rx.groups < 1:
        raise MSBError(f"--group-pattern {pattern!r} has no capture group; put the source/video id in "
                       f"parentheses, e.g. '^(seq\\d+)_'.")
    return rx


def groups_from_pattern(names: Sequence[str], pattern: str) -> list[str]:
    """Source ids from file names: the first capture group of ``re.search(pattern, name)``.

    Args:
        names: file names (no folders), e.g. ``"seq3_0012.png"``.
        pattern: regular expression with at least one capture group (``None`` when the group did not take
            part in the match gives ``''``: the row is a source of its own).

    Returns:
        One id per name.

    Raises:
        MSBError: a bad pattern, or names it does not match (up to 5 named, with the count).
    """
    rx = group_regex(pattern)
    out, missed = [], []
    for name in names:
        m = rx.search(name)
        if m is None:
            missed.append(name)
            out.append("")
        else:
            out.append(m.group(1) or "")
    if missed:
        raise MSBError(f"--group-pattern {pattern!r} does not match {len(missed)} of {len(names)} file names "
                       f"(e.g. {', '.join(missed[:5])}); make the pattern match every name (an optional "
                       f"group, '(...)?', leaves a row ungrouped).")
    return out


__all__ = ["group_regex", "groups_from_pattern"]
