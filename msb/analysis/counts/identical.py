"""Identical systems in one comparison block: detected once and named once, never ranked against each other.

Two systems are *identical* when their counts agree on every image x class (``tp, fp, fn, tn``) and either
they were evaluated from the same checkpoint (the same set of ``checkpoint_sha256`` values in their counts) or
their stored hard predictions (``predictions/<image_id>.npz``, key ``pred``) are equal array for array. When
neither system stored predictions, equal counts on every image are taken as the evidence (said so).
Ranking or testing such a pair would only produce ties and "all differences zero".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from msb.analysis.counts.systems import System

__all__ = ["IdenticalGroup", "identical_groups", "drop_identical"]

_COUNT_COLUMNS = ("tp", "fp", "fn", "tn")
_KEY = ["image_id", "class_id"]


@dataclass(frozen=True)
class IdenticalGroup:
    """Systems found identical: ``kept`` (the one shown), ``others`` (named once, left out), ``reason``,
    ``n_images`` (images compared), ``n_defined`` (images whose Dice is defined: some class with
    ``2 TP + FP + FN > 0``; the paired differences that would all be zero)."""

    kept: str
    others: tuple[str, ...]
    reason: str
    n_images: int
    n_defined: int = 0

    def sentence(self) -> str:
        """One line naming the group, e.g. ``"B is identical to A (same checkpoint SHA-256 1a2b3c4d…)"``."""
        return (f"{', '.join(self.others)} {'is' if len(self.others) == 1 else 'are'} identical to {self.kept} "
                f"({self.reason}; {self.n_images} images): shown once, as {self.kept}")


def _sorted_counts(s: System) -> np.ndarray:
    """The system's ``(key, counts)`` rows sorted by key, as one object array (compared cell by cell)."""
    k = s.rows.sort_values(_KEY)[[*_KEY, *_COUNT_COLUMNS]].reset_index(drop=True)
    return k.astype({"image_id": str}).astype({c: np.int64 for c in _COUNT_COLUMNS}).to_numpy()


def _counts_equal(a: System, b: System, cache: dict | None = None) -> bool:
    cache = {} if cache is None else cache
    ka = cache[a.label] if a.label in cache else cache.setdefault(a.label, _sorted_counts(a))
    kb = cache[b.label] if b.label in cache else cache.setdefault(b.label, _sorted_counts(b))
    if ka.shape != kb.shape:
        return False
    return bool((ka == kb).all())


def _pred_files(s: System, eval_dirs: Mapping[tuple[str, str], Path]) -> dict[str, Path]:
    out = {}
    for (rid, image_id) in s.rows[["run_id", "image_id"]].astype(str).drop_duplicates().itertuples(index=False):
        ev = eval_dirs.get((rid, s.checkpoint_role))
        if ev is not None and (ev / "predictions" / f"{image_id}.npz").is_file():
            out[image_id] = ev / "predictions" / f"{image_id}.npz"
    return out


def _same_predictions(fa: dict[str, Path], fb: dict[str, Path]) -> bool:
    if set(fa) != set(fb):
        return False
    for image_id, pa in fa.items():
        with np.load(pa) as za, np.load(fb[image_id]) as zb:
            if za["pred"].shape != zb["pred"].shape or not np.array_equal(za["pred"], zb["pred"]):
                return False
    return True


def _same(a: System, b: System, eval_dirs: Mapping[tuple[str, str], Path], cache: dict | None = None) -> str | None:
    """Why ``a`` and ``b`` are identical, or None (``cache``: label -> sorted counts, filled on first use)."""
    if not _counts_equal(a, b, cache):
        return None
    sha_a = set(a.rows["checkpoint_sha256"].astype(str)) if "checkpoint_sha256" in a.rows else set()
    sha_b = set(b.rows["checkpoint_sha256"].astype(str)) if "checkpoint_sha256" in b.rows else set()
    if sha_a and sha_a == sha_b:
        return "same checkpoint SHA-256 " + ", ".join(f"{h[:12]}…" for h in sorted(sha_a))
    fa, fb = _pred_files(a, eval_dirs), _pred_files(b, eval_dirs)
    if fa or fb:
        return "identical stored predictions on every image" if _same_predictions(fa, fb) else None
    return "identical counts on every image x class (no stored predictions to compare)"


def identical_groups(systems: Sequence[System], eval_dirs: Mapping[tuple[str, str], Path]) -> list[IdenticalGroup]:
    """Groups of identical systems of one block (module docstring), in the order of ``systems``.

    Args:
        systems: one comparison block (same dataset, split).
        eval_dirs: (run id, checkpoint role) -> evaluation folder (holds ``predictions/``).

    Returns:
        One :class:`IdenticalGroup` per set of >= 2 identical systems (the first in ``systems`` order kept).
    """
    groups, used, cache = [], set(), {}  # each system's counts sorted once, not once per pair
    for i, a in enumerate(systems):
        if a.label in used:
            continue
        others, reason = [], ""
        for b in systems[i + 1:]:
            if b.label in used:
                continue
            why = _same(a, b, eval_dirs, cache)
            if why is not None:
                others.append(b.label)
                used.add(b.label)
                reason = reason or why
        if others:
            den = (2 * a.rows["tp"] + a.rows["fp"] + a.rows["fn"]).groupby(a.rows["image_id"].astype(str)).max()
            groups.append(IdenticalGroup(a.label, tuple(others), reason, int(len(den)), int((den > 0).sum())))
    return groups


def drop_identical(blocks: Mapping[tuple[str, str], list[System]], eval_dirs: Mapping[tuple[str, str], Path]
                   ) -> tuple[dict[tuple[str, str], list[System]], dict[tuple[str, str], list[IdenticalGroup]]]:
    """Keep one system per identical group in every block.

    Returns:
        ``(blocks without the duplicates, (dataset, split) -> groups found)``.
    """
    kept, found = {}, {}
    for key, systems in blocks.items():
        groups = identical_groups(systems, eval_dirs)
        gone = {lab for g in groups for lab in g.others}
        kept[key] = [s for s in systems if s.label not in gone]
        found[key] = groups
    return kept, found


def frame(groups: Mapping[tuple[str, str], Sequence[IdenticalGroup]]) -> pd.DataFrame:
    """Tidy table of the groups: ``dataset, split, kept, identical, reason, n_images``."""
    return pd.DataFrame([{"dataset": k[0], "split": k[1], "kept": g.kept, "identical": ", ".join(g.others),
                          "reason": g.reason, "n_images": g.n_images} for k, gs in groups.items() for g in gs],
                        columns=["dataset", "split", "kept", "identical", "reason", "n_images"])
