"""Raw confusion counts per image x class, and the ``counts.parquet`` schema.

The evaluator stores *counts*, not scores: every score (Dice, IoU, precision, recall) under every
aggregation rule can be recomputed from them later (``msb reaggregate``, :mod:`msb.analysis.counts.aggregate`).
The file layout is documented in ``docs/counts_schema.md``; this module is the single source of truth
for the column names, their order and their dtypes.

Counting follows the usual per-image confusion-matrix convention (cf. segmentation_models_pytorch
``metrics.get_stats`` and MONAI ``get_confusion_matrix``): for one image and one class, with the
binary prediction ``P`` and reference ``R`` over the ``H x W`` pixel grid,

* ``tp = |P & R|``, ``fp = |P & ~R|``, ``fn = |~P & R|``, ``tn = |~P & ~R|`` (pixel counts),
* ``intersection = tp``, ``reference = |R| = tp + fn``, ``predicted = |P| = tp + fp``,
  ``union = |P | R| = tp + fp + fn``, and ``tp + fp + fn + tn = H * W``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from msb.utils.atomic import atomic_path

if TYPE_CHECKING:  # imported where used: the schema constants serve pandas-free readers (reaggregate_fast)
    import pandas as pd  # lazily: the schema constants serve pandas-free readers
__all__ = [
    "COUNTS_SCHEMA_VERSION",
    "PROTOCOL_DEFAULTS",
    "CONTEXT_COLUMNS",
    "RUN_CONTEXT_COLUMNS",
    "COUNT_COLUMNS",
    "COUNTS_COLUMNS",
    "COUNTS_SCHEMA",
    "KEY_COLUMNS",
    "THRESHOLD_ON_VALUES",
    "CHECKPOINT_ROLES",
    "compute_confusion_counts",
    "counts_rows",
    "row_problems",
    "validate_counts_frame",
    "write_counts",
]

#: Version of the ``counts.parquet`` layout, stored in every row's ``schema_version`` column.
#: Bump it when a column is added, removed, renamed or changes meaning.
COUNTS_SCHEMA_VERSION: int = 2

#: Allowed values of the ``threshold_on`` column: the binarisation threshold was applied to
#: probabilities (after sigmoid), to raw logits, or to per-image min-max normalised probability maps
#: (``evaluation.test_time_normalisation: minmax``, the legacy polyp protocol; it forces a positive region
#: into every image, so such rows must never be pooled with plain ``probability`` rows).
THRESHOLD_ON_VALUES: tuple[str, ...] = ("probability", "logit", "minmax_probability")

#: Checkpoint roles the engine writes (``checkpoints/{best,latest}.pt``). Documented, not enforced.
CHECKPOINT_ROLES: tuple[str, ...] = ("best", "latest")

#: Context columns that are the same for every row of one evaluation (one run x checkpoint role);
#: the ``context`` mapping of :func:`counts_rows` holds exactly these keys.
RUN_CONTEXT_COLUMNS: tuple[str, ...] = (
    "dataset", "split", "fold", "run_id", "model", "checkpoint_role", "checkpoint_sha256",
    "config_hash", "threshold", "threshold_on", "split_policy", "input_size", "seed", "variant", "test_time_rule",
)

#: The eight raw pixel counts, in file order.
COUNT_COLUMNS: tuple[str, ...] = (
    "tp", "fp", "fn", "tn", "intersection", "reference", "predicted", "union",
)

#: Context columns added in schema version 2 (the protocol of a run), with the value a version-1 file (and a
#: :func:`counts_rows` context without them) gets: numbers from different protocols are never pooled.
PROTOCOL_DEFAULTS: dict[str, Any] = {
    "split_policy": "unspecified", "input_size": -1, "seed": -1, "variant": "", "test_time_rule": "",
}

#: Ordered schema of ``counts.parquet``: column name -> dtype name (``"string"``, ``"int64"``,
#: ``"float64"``). Meaning of each column: ``docs/counts_schema.md``.
COUNTS_COLUMNS: dict[str, str] = {
    "dataset": "string",            # prepared-dataset name
    "split": "string",              # split evaluated (e.g. "test", "val")
    "fold": "int64",                # cross-validation fold, -1 when the run is not a fold run
    "run_id": "string",             # run folder name runs/<study>/<run_id>
    "model": "string",              # model registry name
    "checkpoint_role": "string",    # "best" or "latest"
    "checkpoint_sha256": "string",  # SHA-256 of the checkpoint file evaluated
    "config_hash": "string",        # SHA-256 of the run's canonical config JSON (config.sha256)
    "image_id": "string",           # sample_id from index.csv
    "class_id": "int64",            # class_id from classes.csv (foreground classes)
    "class_name": "string",         # name from classes.csv
    "threshold": "float64",         # binarisation threshold
    "threshold_on": "string",       # "probability" or "logit"
    "height": "int64",              # native image height in pixels (rows)
    "width": "int64",               # native image width in pixels (columns)
    "source": "string",             # source column of index.csv (origin of the image)
    "split_policy": "string",       # named split protocol of the run, e.g. "random(seed=0,val=0.1,test=0.1)"
    "input_size": "int64",          # network input height in pixels (data.input_size[0]); -1 unknown
    "seed": "int64",                # the run's random_seed (initial weights, augmentation); -1 unknown
    "variant": "string",            # the run's study-axis values, "key=value;key=value" ("" when none)
    "test_time_rule": "string",     # how the model's outputs become one prediction (e.g. "first", "sum")
    "tp": "int64",
    "fp": "int64",
    "fn": "int64",
    "tn": "int64",
    "intersection": "int64",        # = tp
    "reference": "int64",           # = tp + fn (reference pixels)
    "predicted": "int64",           # = tp + fp (predicted pixels)
    "union": "int64",               # = tp + fp + fn
    "schema_version": "int64",      # = COUNTS_SCHEMA_VERSION of the writer
}

#: Columns that identify one row; two rows with the same key describe the same measurement.
KEY_COLUMNS: tuple[str, ...] = (
    "dataset", "split", "fold", "run_id", "checkpoint_role", "image_id", "class_id",
)

#: Per-row context columns (everything except the counts and the schema version).
CONTEXT_COLUMNS: tuple[str, ...] = tuple(
    c for c in COUNTS_COLUMNS if c not in COUNT_COLUMNS and c != "schema_version"
)

_ARROW_TYPES = {"string": pa.string(), "int64": pa.int64(), "float64": pa.float64()}

#: The same schema as a :class:`pyarrow.Schema` (used when writing the Parquet file).
COUNTS_SCHEMA: pa.Schema = pa.schema(
    [pa.field(name, _ARROW_TYPES[kind], nullable=False) for name, kind in COUNTS_COLUMNS.items()],
    metadata={"msb.table": "counts", "msb.schema_version": str(COUNTS_SCHEMA_VERSION)},
)


def compute_confusion_counts(pred: Any, ref: Any) -> dict[str, np.ndarray]:
    """Per image x class confusion counts of binary masks.

    Args:
        pred: predicted masks, boolean array-like (``np.asarray`` is applied, so CPU torch tensors
            work; move CUDA tensors to the CPU first). Shape ``(N, C, H, W)``; ``(C, H, W)`` is read
            as one image (``N = 1``) and ``(H, W)`` as one image with one class (``N = C = 1``).
        ref: reference masks, same shape and dtype rules as ``pred``.

    Returns:
        Dict of ``int64`` arrays of shape ``(N, C)`` (always 2-D, whatever the input rank), in pixels:
        ``tp``, ``fp``, ``fn``, ``tn``, ``intersection`` (= tp), ``reference`` (= tp + fn),
        ``predicted`` (= tp + fp), ``union`` (= tp + fp + fn). ``tp + fp + fn + tn == H * W``.

    Raises:
        ValueError: if ``pred`` or ``ref`` is not boolean, if their shapes differ (both shapes are
            named), or if their rank is not 2, 3 or 4.

    Definitions as in segmentation_models_pytorch ``metrics.get_stats`` / MONAI
    ``get_confusion_matrix``; computed with three vectorised popcounts (``|P & R|``, ``|P|``, ``|R|``).
    """
    p = np.asarray(pred)
    r = np.asarray(ref)
    if p.dtype != np.bool_ or r.dtype != np.bool_:
        raise ValueError(
            f"compute_confusion_counts needs boolean masks, got pred dtype {p.dtype} and ref dtype "
            f"{r.dtype}; binarise first (e.g. prob >= threshold)")
    if p.shape != r.shape:
        raise ValueError(f"pred shape {p.shape} differs from ref shape {r.shape}")
    if p.ndim == 2:
        p, r = p[None, None], r[None, None]
    elif p.ndim == 3:
        p, r = p[None], r[None]
    elif p.ndim != 4:
        raise ValueError(f"masks must have shape (H, W), (C, H, W) or (N, C, H, W); got {p.shape}")
    n, c, h, w = p.shape
    p2 = p.reshape(n * c, h * w)
    r2 = r.reshape(n * c, h * w)
    tp = _popcount_rows(p2 & r2).reshape(n, c)
    predicted = _popcount_rows(p2).reshape(n, c)
    reference = _popcount_rows(r2).reshape(n, c)
    fp = predicted - tp
    fn = reference - tp
    union = tp + fp + fn
    tn = np.int64(h * w) - union
    return {
        "tp": tp, "fp": fp, "fn": fn, "tn": tn.astype(np.int64, copy=False),
        "intersection": tp.copy(), "reference": reference, "predicted": predicted, "union": union,
    }


def _popcount_rows(a: np.ndarray) -> np.ndarray:
    """Number of True values in each row of a 2-D bool array, as int64 ``(rows,)``.

    Whole-row ``np.count_nonzero`` uses a popcount kernel that is several times faster than an axis
    reduction, so large rows (native-resolution images) are counted one by one.
    """
    rows, length = a.shape
    if length >= 4096 or rows == 1:
        return np.fromiter((np.count_nonzero(row) for row in a), dtype=np.int64, count=rows)
    return a.sum(axis=1, dtype=np.int64)


def _per_image(value: Any, n: int, name: str) -> list:
    """Broadcast a scalar to ``n`` items, or check that a sequence has ``n`` items."""
    if isinstance(value, (str, bytes)) or np.ndim(value) == 0:
        return [value] * n
    items = list(value)
    if len(items) != n:
        raise ValueError(f"{name} has {len(items)} items but the counts describe {n} images")
    return items


def counts_rows(
    context: Mapping[str, Any],
    counts: Mapping[str, np.ndarray],
    *,
    image_ids: Sequence[str],
    class_ids: Sequence[int],
    class_names: Sequence[str],
    heights: int | Sequence[int],
    widths: int | Sequence[int],
    sources: str | Sequence[str] = "",
) -> pd.DataFrame:
    """Build the ``counts.parquet`` rows for a batch of images.

    Args:
        context: the keys of :data:`RUN_CONTEXT_COLUMNS` (``dataset``, ``split``, ``fold``,
            ``run_id``, ``model``, ``checkpoint_role``, ``checkpoint_sha256``, ``config_hash``,
            ``threshold``, ``threshold_on``, and the protocol keys ``split_policy``, ``input_size``, ``seed``,
            ``variant``, ``test_time_rule``, which default to :data:`PROTOCOL_DEFAULTS` when absent); scalars
            repeated on every row. ``fold`` is -1 when the run is not a fold run; ``threshold_on`` is
            ``"probability"`` or ``"logit"``.
        counts: output of :func:`compute_confusion_counts`: the eight :data:`COUNT_COLUMNS`, each an
            integer array of shape ``(N, C)`` (a 1-D ``(C,)`` array is read as ``N = 1``).
        image_ids: ``N`` image ids (``sample_id``), in the order of the counts' first axis.
        class_ids: ``C`` class ids, in the order of the counts' second axis.
        class_names: ``C`` class names.
        heights, widths: native size in pixels, one int for all images or ``N`` ints.
        sources: ``source`` of each image, one string for all images or ``N`` strings.

    Returns:
        DataFrame with the columns of :data:`COUNTS_COLUMNS` in order and their dtypes, ``N * C``
        rows ordered image-major (row ``i * C + j`` is image ``i``, class ``j``), ``schema_version``
        set to :data:`COUNTS_SCHEMA_VERSION`.

    Raises:
        ValueError: missing/unknown context keys, bad ``threshold_on``, length mismatches, or
            counts whose ``tp + fp + fn + tn`` differs from ``height * width``.
    """
    import pandas as pd  # lazily: the schema constants serve pandas-free readers
    context = {**PROTOCOL_DEFAULTS, **context}
    missing = [k for k in RUN_CONTEXT_COLUMNS if k not in context]
    unknown = [k for k in context if k not in RUN_CONTEXT_COLUMNS]
    if missing or unknown:
        raise ValueError(f"counts_rows context: missing keys {missing}, unknown keys {unknown}; "
                         f"expected exactly {list(RUN_CONTEXT_COLUMNS)}")
    if context["threshold_on"] not in THRESHOLD_ON_VALUES:
        raise ValueError(f"threshold_on must be one of {THRESHOLD_ON_VALUES}, "
                         f"got {context['threshold_on']!r}")
    missing_counts = [k for k in COUNT_COLUMNS if k not in counts]
    if missing_counts:
        raise ValueError(f"counts_rows counts: missing arrays {missing_counts}")
    arrays = {}
    for k in COUNT_COLUMNS:
        a = np.asarray(counts[k])
        if a.ndim == 1:
            a = a[None]
        if a.ndim != 2:
            raise ValueError(f"counts[{k!r}] must have shape (N, C), got {a.shape}")
        if not np.issubdtype(a.dtype, np.integer):
            raise ValueError(f"counts[{k!r}] must be integer, got {a.dtype}")
        arrays[k] = a.astype(np.int64, copy=False)
    shapes = {a.shape for a in arrays.values()}
    if len(shapes) != 1:
        raise ValueError(f"count arrays have different shapes: {sorted(shapes)}")
    n, c = shapes.pop()
    image_ids = list(image_ids)
    class_ids = list(class_ids)
    class_names = list(class_names)
    if len(image_ids) != n:
        raise ValueError(f"image_ids has {len(image_ids)} items but the counts describe {n} images")
    if len(class_ids) != c or len(class_names) != c:
        raise ValueError(f"class_ids ({len(class_ids)}) and class_names ({len(class_names)}) must "
                         f"both have {c} items, one per count column")
    h = np.asarray(_per_image(heights, n, "heights"), dtype=np.int64)
    w = np.asarray(_per_image(widths, n, "widths"), dtype=np.int64)
    src = _per_image(sources, n, "sources")
    total = arrays["tp"] + arrays["fp"] + arrays["fn"] + arrays["tn"]
    bad = np.argwhere(total != (h * w)[:, None])
    if bad.size:
        i, j = bad[0]
        raise ValueError(f"image {image_ids[i]!r} class {class_ids[j]}: tp+fp+fn+tn = {total[i, j]} "
                         f"but height*width = {h[i]}*{w[i]} = {h[i] * w[i]}")

    rows = n * c
    data: dict[str, Any] = {}
    for col in COUNTS_COLUMNS:
        if col in RUN_CONTEXT_COLUMNS:
            data[col] = [context[col]] * rows
        elif col == "image_id":
            data[col] = np.repeat(np.asarray([str(x) for x in image_ids], dtype=object), c)
        elif col == "class_id":
            data[col] = np.tile(np.asarray(class_ids, dtype=np.int64), n)
        elif col == "class_name":
            data[col] = np.tile(np.asarray([str(x) for x in class_names], dtype=object), n)
        elif col == "height":
            data[col] = np.repeat(h, c)
        elif col == "width":
            data[col] = np.repeat(w, c)
        elif col == "source":
            data[col] = np.repeat(np.asarray([str(x) for x in src], dtype=object), c)
        elif col in COUNT_COLUMNS:
            data[col] = arrays[col].reshape(rows)
        elif col == "schema_version":
            data[col] = np.full(rows, COUNTS_SCHEMA_VERSION, dtype=np.int64)
    df = pd.DataFrame(data)
    return _coerce(df)


def _coerce(df: pd.DataFrame) -> pd.DataFrame:
    """Cast columns to the schema dtypes (strings to pandas' string dtype)."""
    import pandas as pd  # lazily: the schema constants serve pandas-free readers
    out = {}
    for col, kind in COUNTS_COLUMNS.items():
        s = df[col]
        if kind == "string":
            out[col] = s.astype(pd.StringDtype(na_value=np.nan)) if len(s) else s.astype(object)
        else:
            out[col] = s.astype(kind)
    return pd.DataFrame(out, index=pd.RangeIndex(len(df)))


def validate_counts_frame(df: pd.DataFrame) -> list[str]:
    """Check a counts DataFrame against :data:`COUNTS_COLUMNS`; return a list of problems.

    Checks: every schema column present and no other column; no missing values; dtypes (strings must
    be strings, ints integer dtype, ``threshold`` float or integer); counts >= 0; derived counts
    consistent (``intersection == tp``, ``reference == tp + fn``, ``predicted == tp + fp``,
    ``union == tp + fp + fn``); ``tp + fp + fn + tn == height * width``; ``threshold_on`` in
    :data:`THRESHOLD_ON_VALUES`. Row problems name the first offending row (``image_id``,
    ``class_id``). An empty list means the frame is valid.
    """
    import pandas as pd  # lazily: the schema constants serve pandas-free readers
    problems: list[str] = []
    missing = [c for c in COUNTS_COLUMNS if c not in df.columns]
    extra = [c for c in df.columns if c not in COUNTS_COLUMNS]
    if missing:
        problems.append(f"missing columns {missing}")
    if extra:
        problems.append(f"unexpected columns {extra}")
    if missing:
        return problems
    for col, kind in COUNTS_COLUMNS.items():
        s = df[col]
        if s.isna().any():
            problems.append(f"column {col!r} has missing values")
            continue
        if kind == "string":
            if not (pd.api.types.is_string_dtype(s) or
                    (s.dtype == object and s.map(lambda v: isinstance(v, str)).all())):
                problems.append(f"column {col!r} must hold strings, has dtype {s.dtype}")
        elif kind == "int64":
            if not pd.api.types.is_integer_dtype(s):
                problems.append(f"column {col!r} must be int64, has dtype {s.dtype}")
        elif kind == "float64":
            if not (pd.api.types.is_float_dtype(s) or pd.api.types.is_integer_dtype(s)):
                problems.append(f"column {col!r} must be float64, has dtype {s.dtype}")
    if problems:
        return problems
    problems.extend(row_problems(df))
    return problems


def _row_label(df: pd.DataFrame, mask: np.ndarray) -> str:
    i = int(np.flatnonzero(mask)[0])
    return (f"row {i} (image_id={df['image_id'].iloc[i]!r}, class_id={int(df['class_id'].iloc[i])}); "
            f"{int(mask.sum())} row(s) affected")


def row_problems(df: pd.DataFrame) -> list[str]:
    """Value checks on a counts frame whose columns and dtypes are already valid.

    Returns a list of messages (empty when valid), each naming the first offending row by position,
    ``image_id`` and ``class_id``: negative counts, inconsistent derived counts,
    ``tp + fp + fn + tn != height * width``, non-positive size, unknown ``threshold_on``.
    """
    problems: list[str] = []
    cnt = {c: df[c].to_numpy(dtype=np.int64) for c in COUNT_COLUMNS}
    neg = np.zeros(len(df), dtype=bool)
    for c in COUNT_COLUMNS:
        neg |= cnt[c] < 0
    if neg.any():
        cols = [c for c in COUNT_COLUMNS if (cnt[c] < 0).any()]
        problems.append(f"negative counts in {cols} at {_row_label(df, neg)}")
        return problems
    derived = ((cnt["intersection"] != cnt["tp"]) | (cnt["reference"] != cnt["tp"] + cnt["fn"])
               | (cnt["predicted"] != cnt["tp"] + cnt["fp"])
               | (cnt["union"] != cnt["tp"] + cnt["fp"] + cnt["fn"]))
    if derived.any():
        problems.append("derived counts disagree with tp/fp/fn (need intersection = tp, reference = "
                        "tp+fn, predicted = tp+fp, union = tp+fp+fn) at " + _row_label(df, derived))
    h = df["height"].to_numpy(dtype=np.int64)
    w = df["width"].to_numpy(dtype=np.int64)
    size = (h <= 0) | (w <= 0)
    if size.any():
        problems.append(f"height and width must be positive at {_row_label(df, size)}")
    total = cnt["tp"] + cnt["fp"] + cnt["fn"] + cnt["tn"]
    bad = total != h * w
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        problems.append(f"tp+fp+fn+tn = {total[i]} differs from height*width = {h[i]}*{w[i]} = "
                        f"{h[i] * w[i]} at {_row_label(df, bad)}")
    on = df["threshold_on"].astype(object).to_numpy()
    bad_on = ~np.isin(on, np.asarray(THRESHOLD_ON_VALUES, dtype=object))
    if bad_on.any():
        found = sorted({str(v) for v in on[bad_on]})
        problems.append(f"threshold_on must be one of {list(THRESHOLD_ON_VALUES)}, found {found} at "
                        + _row_label(df, bad_on))
    thr = df["threshold"].to_numpy(dtype=np.float64)
    bad_thr = ~np.isfinite(thr)
    if bad_thr.any():
        problems.append(f"threshold must be finite at {_row_label(df, bad_thr)}")
    return problems


def write_counts(df: pd.DataFrame, path: str | Path) -> Path:
    """Validate ``df`` against the counts schema and write it atomically as Parquet.

    Args:
        df: rows as built by :func:`counts_rows` (possibly several batches concatenated); columns
            exactly :data:`COUNTS_COLUMNS` in any order (written in schema order).
        path: destination, conventionally ``runs/<study>/<run_id>/evaluation/<role>/counts.parquet``;
            the parent folder is created.

    Returns:
        The destination path.

    Raises:
        ValueError: listing every schema problem found by :func:`validate_counts_frame`; nothing is
            written in that case (and an error while writing leaves no partial file, see
            :mod:`msb.utils.atomic`).
    """
    problems = validate_counts_frame(df)
    if problems:
        raise ValueError(f"counts table for {path} does not match the counts schema: "
                         + "; ".join(problems))
    frame = _coerce(df)
    # pandas' string dtype -> plain Python strings for pyarrow's from_pandas with an explicit schema
    table = pa.Table.from_pandas(frame, schema=COUNTS_SCHEMA, preserve_index=False)
    table = table.replace_schema_metadata(COUNTS_SCHEMA.metadata)
    path = Path(path)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)
    return path
