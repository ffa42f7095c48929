"""``merge``: several prepared datasets -> one multi-source prepared dataset (``msb data merge``).

Each part is a prepared dataset folder (``root``) or a converter run (``converter``, ``source``, ``options``:
prepared into a temporary folder first, e.g. BKAI-IGH with ``merge_polyp_classes: true`` so that its two classes
become one ``polyp`` class). Every part must have the same ``classes.csv`` (ids, names, raw values); the merged
dataset keeps it. Per part, ``limit`` keeps a seeded, group-aware subset: whole groups (empty group = the sample
alone) in ``numpy.random.default_rng(seed)`` order until at least ``limit`` samples are taken.

Merged rows: ``sample_id`` = ``<part>__<sample_id>``; files copied byte for byte to ``<part>/<image_path>``;
``source`` = the part name (what populations and pools select on); ``group`` = ``<part>:<group>`` (empty stays
empty), so groups never join across parts; ``split`` emptied (the run draws the split) unless ``keep_splits``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from msb.data.converters.staging import ConversionReport, staged_output
from msb.data.schema import INDEX_COLUMNS, load_prepared_dataset, write_prepared_dataset
from msb.errors import MSBError

__all__ = ["convert_merge", "subset_groups", "SEPARATOR"]

SEPARATOR = "__"
_PART_KEYS = {"name", "root", "converter", "source", "options", "limit"}


def subset_groups(index: pd.DataFrame, limit: int | None, seed: int) -> pd.DataFrame:
    """Rows of whole groups, in seeded group order, until at least ``limit`` rows (all rows when ``None``).

    Raises:
        MSBError: ``limit`` not a positive integer.
    """
    if limit is None:
        return index
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise MSBError(f"merge: part limit must be a positive integer, got {limit!r}")
    keys = [g if g else f"\0{s}" for s, g in zip(index["sample_id"], index["group"])]
    uniq = sorted(set(keys))
    order = np.random.default_rng(seed).permutation(len(uniq))
    size = pd.Series(keys).value_counts()
    take, n = set(), 0
    for k in order:
        if n >= limit:
            break
        take.add(uniq[k])
        n += int(size[uniq[k]])
    return index[[k in take for k in keys]].reset_index(drop=True)


def _check_part(part: Any, i: int) -> dict[str, Any]:
    if not isinstance(part, dict) or not isinstance(part.get("name"), str) or not part["name"]:
        raise MSBError(f"merge: parts[{i}] must be a mapping with a 'name' (the source label), got {part!r}")
    bad = sorted(set(part) - _PART_KEYS)
    if bad:
        raise MSBError(f"merge: parts[{i}] ({part['name']}): unknown key(s) {bad}; valid: {sorted(_PART_KEYS)}")
    if ("root" in part) == ("converter" in part):
        raise MSBError(f"merge: parts[{i}] ({part['name']}): give either 'root' (a prepared folder) or 'converter' "
                       f"(+ source, options)")
    if SEPARATOR in part["name"] or "/" in part["name"]:
        raise MSBError(f"merge: parts[{i}]: name {part['name']!r} may not contain '{SEPARATOR}' or '/'")
    return part


def convert_merge(source: str | os.PathLike | None, out: str | os.PathLike, *, parts: list[dict[str, Any]],
                  seed: int = 0, keep_splits: bool = False, overwrite: bool = False,
                  prepare: Callable[..., ConversionReport] | None = None) -> ConversionReport:
    """Merge prepared datasets (module docstring) into ``out``.

    Args:
        source: ignored (each part names its own).
        out: destination folder (built in a hidden temporary sibling, renamed at the end).
        parts: ``[{name, root}]`` or ``[{name, converter, source, options}]``, each with an optional ``limit``.
        seed: seed of the per-part subsets.
        keep_splits: keep each part's ``split`` column (default: empty, the run decides).
        overwrite: replace an existing non-empty ``out``.
        prepare: the converter entry point for ``converter`` parts (the registry passes
            :func:`msb.data.converters.prepare_dataset`).

    Returns:
        :class:`ConversionReport` (no mask pixel changed here; a part converter's changes are in the notes).

    Raises:
        MSBError: fewer than two parts, a bad part, two parts with one name, parts whose ``classes.csv`` differ
            (both named), any error of a part's converter or of validation. Nothing is left at ``out``.
    """
    if not isinstance(parts, list) or len(parts) < 2:
        raise MSBError(f"merge: 'parts' must list at least two datasets, got {parts!r}")
    parts = [_check_part(p, i) for i, p in enumerate(parts)]
    names = [p["name"] for p in parts]
    if len(set(names)) != len(names):
        raise MSBError(f"merge: part names {names} repeat; give each part its own name")
    out = Path(out).expanduser().absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}.parts-", dir=out.parent))
    notes: list[str] = []
    try:
        loaded = []
        for p in parts:
            if "root" in p:
                root = Path(p["root"]).expanduser()
            else:
                root = scratch / p["name"]
                if prepare is None:
                    raise MSBError(f"merge: part {p['name']!r} names a converter; run the merge through "
                                   f"msb.data.converters.prepare_dataset('merge', ...) or `msb data merge`")
                rep = prepare(p["converter"], p.get("source"), root, **(p.get("options") or {}))
                notes.append(f"part {p['name']}: {rep.summary().splitlines()[0]}")
            ds = load_prepared_dataset(root)
            loaded.append((p, ds))
        first_p, first = loaded[0]
        for p, ds in loaded[1:]:
            if list(ds.classes) != list(first.classes):
                raise MSBError(f"merge: part {p['name']!r} ({ds.root}) has classes {ds.classes}, part "
                               f"{first_p['name']!r} has {first.classes}; merge datasets with the same classes.csv "
                               f"(e.g. BKAI-IGH with merge_polyp_classes: true)")
        rows = []
        with staged_output(out, overwrite=overwrite) as tmp:
            for p, ds in loaded:
                idx = subset_groups(ds.index, p.get("limit"), seed)
                for r in idx.to_dict("records"):
                    for col in ("image_path", "mask_path"):
                        dst = tmp / p["name"] / r[col]
                        dst.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copyfile(ds.root / r[col], dst)
                        r[col] = f"{p['name']}/{r[col]}"
                    r["sample_id"] = f"{p['name']}{SEPARATOR}{r['sample_id']}"
                    r["group"] = f"{p['name']}:{r['group']}" if r["group"] else ""
                    r["source"] = p["name"]
                    if not keep_splits:
                        r["split"] = ""
                    rows.append(r)
                notes.append(f"part {p['name']}: {len(idx)} of {len(ds.index)} samples"
                             + (f" (limit {p['limit']}, whole groups, seed {seed})" if p.get("limit") else ""))
            cols = list(INDEX_COLUMNS) + [c for c in ("spacing_row", "spacing_col") if any(c in r for r in rows)]
            index = pd.DataFrame(rows)[cols].fillna("")
            write_prepared_dataset(tmp, index, first.classes)
            load_prepared_dataset(tmp, check_files=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return ConversionReport(n_samples=len(rows), n_changed_mask_pixels=0, notes=notes, out=out, name="merge")
