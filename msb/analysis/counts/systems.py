"""Systems (the things compared) in a counts table, and pairing their images.

A *system* is one evaluated model configuration on one dataset split with one checkpoint role: by default
one run (the fold runs of one configuration pooled, see :func:`find_systems`), or, with ``by="model"``, every
run of a registry model. Two systems are compared on the same
images: rows are paired on :data:`msb.analysis.counts.rules.PAIR_KEY` (``dataset, split, image_id``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from msb.analysis.counts.rules import PAIR_KEY, ImageTable, image_table
from msb.errors import MSBError

__all__ = ["SYSTEM_BY", "System", "find_systems", "variant_slug", "comparison_blocks", "align_tables"]

#: Ways to define a system: ``run`` (run id, fold token removed) or ``model`` (registry name).
SYSTEM_BY: tuple[str, ...] = ("run", "model")
_FOLD_TOKEN = re.compile(r"[-_.]?fold[-_]?\d+", re.IGNORECASE)
_HASH_SUFFIX = re.compile(r"-[0-9a-f]{8}$")
_ENSEMBLE_SUFFIX = re.compile(r"-ensemble\d*$")
_MAX_LISTED = 5


@dataclass(frozen=True)
class System:
    """One compared system.

    Attributes:
        label: short display name (unique within a study's comparison block).
        dataset, split, checkpoint_role: what was evaluated.
        run_ids: the runs pooled into the system (several for K-fold runs).
        rows: its counts rows.
    """

    label: str
    dataset: str
    split: str
    checkpoint_role: str
    run_ids: tuple[str, ...]
    rows: pd.DataFrame

    def table(self) -> ImageTable:
        """The system's :class:`~msb.analysis.counts.rules.ImageTable` (raises :class:`MSBError` on bad rows)."""
        return image_table(self.rows, f"system {self.label!r}")


def variant_slug(variant: str) -> str:
    """Folder-style name of a counts row's ``variant`` (its study-axis values, ``key=<JSON>;...``), the same
    spelling as the study unit names (:func:`msb.config.generate.axes_slug`): last key part + value, lists joined
    by ``x``, axes joined by ``-``; e.g. ``data.input_size=[128,128];random_seed=1`` ->
    ``input_size128x128-random_seed1``; ``""`` for no variant."""
    def value(v: object) -> str:
        if isinstance(v, (list, tuple)):
            return "x".join(value(x) for x in v)
        if isinstance(v, dict):
            return "_".join(f"{k}{value(v[k])}" for k in sorted(v))
        return str(v)

    parts = []
    for item in sorted(t for t in str(variant).split(";") if "=" in t):
        key, raw = item.split("=", 1)
        try:
            val = json.loads(raw)
        except ValueError:
            val = raw
        parts.append(f"{key.split('.')[-1]}{value(val)}")
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", "-".join(parts))


def _name(run_id: str, dataset: str, is_fold: bool = False, variant: str = "") -> str:
    name = _FOLD_TOKEN.sub("", run_id)
    if is_fold:  # fold runs differ by their config hash too: <dataset>-<arch>-<hash8>
        name = _HASH_SUFFIX.sub("", name)
    prefix = f"{dataset}-"
    name = name[len(prefix):] if name.startswith(prefix) and len(name) > len(prefix) else name
    slug = variant_slug(variant)
    if slug and not name.endswith(f"-{slug}") and f"-{slug}-" not in name:
        # runs of one architecture at two axis values (e.g. input sizes 256 and 512 of one study) would
        # otherwise share a label once the config hash is removed
        ens = _ENSEMBLE_SUFFIX.search(name)
        name = (name[:ens.start()] + f"-{slug}" + name[ens.start():]) if ens else f"{name}-{slug}"
    return name


def find_systems(df: pd.DataFrame, by: str = "run") -> list[System]:
    """Split a counts table into systems.

    Args:
        df: counts rows (several runs, datasets, splits, roles).
        by: ``"run"``: one system per run id with the ``<dataset>-`` prefix removed; for fold rows
            (``fold >= 0``) a ``fold<k>`` token and a trailing ``-<8 hex>`` config hash are removed too, so the
            folds of one configuration (``<dataset>-<arch>-<hash8>`` per fold) form one system when each fold
            saw different images (cross-validation on held-out folds); when the folds saw the same images
            (every fold evaluated on one test or external set), each fold is its own system
            (``<name>-fold<k>``) beside the fold ensemble, so that no image is counted twice;
            ``"model"``: one per ``model`` value. Rows with a study ``variant`` (axes, e.g. two input sizes of one
            study) get its slug (:func:`variant_slug`) in the name, before any ``-ensemble`` suffix:
            ``unet_r18-input_size128x128-fold0``, ``unet_r18-<hash8>-input_size128x128-ensemble``.

    Returns:
        Systems sorted by dataset, split, label; labels get ``@<role>`` appended when the table holds more
        than one checkpoint role.

    Raises:
        MSBError: unknown ``by``; empty table.
    """
    if by not in SYSTEM_BY:
        raise MSBError(f"unknown system definition {by!r}; choose from {list(SYSTEM_BY)}")
    if len(df) == 0:
        raise MSBError("no count rows: nothing to compare")
    variants = (df["variant"].astype(str) if "variant" in df.columns
                else pd.Series([""] * len(df), index=df.index))
    if by == "model":
        names = pd.Series([m if not variant_slug(v) else f"{m}-{variant_slug(v)}"
                           for m, v in zip(df["model"].astype(str), variants)], index=df.index)
    else:
        names = pd.Series([_name(r, d, f >= 0, v) for r, d, f, v in
                           zip(df["run_id"].astype(str), df["dataset"].astype(str), df["fold"].to_numpy(), variants)],
                          index=df.index)
    roles = df["checkpoint_role"].astype(str)
    several_roles = roles.nunique() > 1
    out = []
    keys = pd.DataFrame({"dataset": df["dataset"].astype(str), "split": df["split"].astype(str),
                         "name": names, "role": roles})
    for (ds, sp, name, role), idx in keys.groupby(["dataset", "split", "name", "role"], sort=True).groups.items():
        rows = df.loc[idx]
        label = f"{name}@{role}" if several_roles else name
        run_ids = tuple(sorted(set(rows["run_id"].astype(str))))
        if len(run_ids) > 1 and rows.duplicated(["image_id", "class_id"]).any():
            # the runs saw the same images (e.g. every fold evaluated on one held-out test set or an external
            # set): pooling them would count an image twice, so each run is its own system
            for rid in run_ids:
                sub = rows[rows["run_id"].astype(str) == rid]
                folds = sorted(set(int(f) for f in sub["fold"]))
                tag = f"fold{folds[0]}" if len(folds) == 1 and folds[0] >= 0 else rid
                out.append(System(f"{name}-{tag}" + (f"@{role}" if several_roles else ""), ds, sp, role,
                                  (rid,), sub))
            continue
        out.append(System(label, ds, sp, role, run_ids, rows))
    return out


def comparison_blocks(systems: Sequence[System]) -> dict[tuple[str, str], list[System]]:
    """Systems grouped by ``(dataset, split)``: only systems evaluated on the same images are compared."""
    out: dict[tuple[str, str], list[System]] = {}
    for s in systems:
        out.setdefault((s.dataset, s.split), []).append(s)
    return out


def align_tables(tables: Mapping[str, ImageTable], on_mismatch: str = "error") -> dict[str, ImageTable]:
    """Reorder several systems' tables so that row ``i`` is the same image in all of them.

    Args:
        tables: label -> table.
        on_mismatch: ``"error"``: the image sets must be equal; ``"intersect"``: keep the common images.

    Returns:
        label -> table restricted to the common images, all in the first table's image order.

    Raises:
        MSBError: an image occurring twice within one system (e.g. two runs of the same configuration pooled:
            compare them as separate systems); different class ids; with ``"error"``, different image sets
            (counts and the first differing ids are named); no common image.
    """
    labels = list(tables)
    if not labels:
        return {}
    keyed = {}
    for lab in labels:
        t = tables[lab]
        idx = pd.MultiIndex.from_frame(t.keys[list(PAIR_KEY)].astype(object))
        if idx.has_duplicates:
            dup = idx[idx.duplicated()][0]
            raise MSBError(f"system {lab!r}: image {dup[-1]!r} ({dup[0]}/{dup[1]}) occurs in several of its runs "
                           f"{sorted(set(t.keys['run_id']))}; compare those runs as separate systems "
                           f"(system definition 'run')")
        keyed[lab] = idx
    ref = labels[0]
    for lab in labels[1:]:
        if not np.array_equal(tables[lab].class_ids, tables[ref].class_ids):
            raise MSBError(f"systems {ref!r} and {lab!r} have different classes "
                           f"({tables[ref].class_ids.tolist()} vs {tables[lab].class_ids.tolist()})")
    common = keyed[ref]
    for lab in labels[1:]:
        common = common.intersection(keyed[lab], sort=False)
    if on_mismatch not in ("error", "intersect"):
        raise ValueError(f"on_mismatch must be 'error' or 'intersect', not {on_mismatch!r}")
    if on_mismatch == "error":
        for lab in labels[1:]:
            only_a = keyed[ref].difference(keyed[lab])
            only_b = keyed[lab].difference(keyed[ref])
            if len(only_a) or len(only_b):
                raise MSBError(
                    f"systems {ref!r} and {lab!r} were evaluated on different images: {len(only_a)} only in "
                    f"{ref!r} (first {[k[-1] for k in only_a[:_MAX_LISTED]]}), {len(only_b)} only in {lab!r} "
                    f"(first {[k[-1] for k in only_b[:_MAX_LISTED]]}); paired comparisons need the same images")
    if len(common) == 0:
        raise MSBError(f"systems {labels} share no image (paired on {list(PAIR_KEY)})")
    order = keyed[ref].get_indexer(common)
    order = np.sort(order)
    common_sorted = keyed[ref][order]
    return {lab: tables[lab].subset(keyed[lab].get_indexer(common_sorted)) for lab in labels}
