"""Reading external prediction files for ``msb score``: file rules, declared semantics, matching to sample ids.

A prediction folder holds one file per image, ``<name>.png`` (8-bit or 16-bit grey), ``<name>.npy`` or
``<name>.npz`` (key ``prob``, ``pred`` or its only array), shaped (H, W) for a dataset with one foreground class
or (C, H, W) with C = its number of foreground classes (channel order = ``class_id`` order). ``<name>`` is
matched to a sample of the prepared dataset by an id rule (:data:`ID_RULES`).

The user declares what the values mean (:class:`Semantics`), nothing is guessed silently:

* ``binary``: a hard mask; every value must be 0 or the foreground value (1, or the scale: 255 for 8-bit,
  65535 for 16-bit); anything else is refused naming the file and the values found;
* ``probability``: a map ``p = value / scale`` in [0, 1] (scale ``auto``: 255 for uint8, 65535 for uint16,
  1 for float and bool); values outside [0, 1] after scaling, or NaN, are refused naming the file;
  optionally min-max normalised per image (``minmax``, the old polyp test scripts) before the threshold.

A map whose size differs from the native image size is refused (``resize: none``, default) or resized to it
(``nearest``, or ``bilinear`` with ``align_corners=False`` as the evaluator upsamples logits; binary masks
resized bilinearly are thresholded again at 0.5).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from msb.data.schema import PreparedDataset
from msb.errors import MSBError

__all__ = ["ID_RULES", "PREDICTION_SUFFIXES", "Semantics", "list_prediction_files", "match_files",
           "read_prediction", "to_probability", "resize_map"]

#: File suffixes read as predictions (lower case); other files in the folder are refused as unknown.
PREDICTION_SUFFIXES: tuple[str, ...] = (".png", ".npy", ".npz")

#: How a file name is matched to a sample: ``stem`` = the file stem is the ``sample_id``; ``mask-name`` /
#: ``image-name`` = the file stem is the stem of the sample's mask / image file in ``index.csv`` (the names
#: the original dataset used, as in the PraNet result folders).
ID_RULES: tuple[str, ...] = ("stem", "mask-name", "image-name")

_AUTO_SCALE = {np.dtype(np.uint8): 255.0, np.dtype(np.uint16): 65535.0}


@dataclass(frozen=True)
class Semantics:
    """What the values of a prediction folder mean (recorded in ``prediction_semantics.json``).

    Attributes:
        kind: ``binary`` (hard masks) or ``probability`` (maps in [0, 1] after dividing by ``scale``).
        threshold: foreground = ``p >= threshold`` (probability maps; 0.5 for binary masks).
        scale: ``auto`` (uint8 -> 255, uint16 -> 65535, float/bool -> 1) or a number: the value meaning p = 1.
        minmax: min-max normalise each map per image and channel, ``(p - min) / (max - min + 1e-8)``
            (:func:`msb.evaluation.postprocess.minmax_normalise`), before the threshold.
        resize: ``none`` (a size mismatch is an error), ``nearest`` or ``bilinear`` to the native size.
    """

    kind: Literal["binary", "probability"]
    threshold: float = 0.5
    scale: str = "auto"
    minmax: bool = False
    resize: Literal["none", "nearest", "bilinear"] = "none"

    def __post_init__(self) -> None:
        if self.kind not in ("binary", "probability"):
            raise MSBError(f"--semantics must be binary or probability, not {self.kind!r}")
        if self.resize not in ("none", "nearest", "bilinear"):
            raise MSBError(f"--resize must be none, nearest or bilinear, not {self.resize!r}")
        if not (math.isfinite(self.threshold) and 0.0 < self.threshold <= 1.0):
            raise MSBError(f"--threshold must be in (0, 1], got {self.threshold!r}")
        if self.kind == "binary" and (self.minmax or self.threshold != 0.5):
            raise MSBError("--minmax and --threshold apply to probability maps only; binary masks are "
                           "foreground where the mask is set (drop them, or declare --semantics probability)")
        if self.scale != "auto":
            try:
                ok = float(self.scale) > 0 and math.isfinite(float(self.scale))
            except ValueError:
                ok = False
            if not ok:
                raise MSBError(f"--scale must be 'auto' or a positive number (255, 65535, 1), not {self.scale!r}")

    def as_dict(self) -> dict:
        """The fields as a JSON-ready dict."""
        return asdict(self)


def list_prediction_files(folder: Path) -> dict[str, Path]:
    """``{file stem: path}`` of the prediction files directly in ``folder`` (hidden files skipped).

    Raises:
        MSBError: the folder is missing or empty; a file with another suffix (named); two files with one stem.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise MSBError(f"{folder}: prediction folder not found")
    out: dict[str, Path] = {}
    for p in sorted(folder.iterdir()):
        if p.name.startswith(".") or p.is_dir():
            continue
        if p.suffix.lower() not in PREDICTION_SUFFIXES:
            raise MSBError(f"{p}: not a prediction file (expected {', '.join(PREDICTION_SUFFIXES)}); move it out of "
                           f"the prediction folder")
        if p.stem in out:
            raise MSBError(f"{p}: a second prediction for '{p.stem}' (also {out[p.stem].name}); keep one of them")
        out[p.stem] = p
    if not out:
        raise MSBError(f"{folder}: no prediction files ({', '.join(PREDICTION_SUFFIXES)}) in the folder")
    return out


def match_files(files: dict[str, Path], ds: PreparedDataset, sample_ids: list[str], id_rule: str
                ) -> tuple[dict[str, Path], list[str], list[Path]]:
    """Match prediction files to the samples to score.

    Args:
        files: :func:`list_prediction_files`.
        ds: the prepared dataset; sample_ids: the samples to score (in order); id_rule: one of :data:`ID_RULES`.

    Returns:
        (``{sample_id: file}``, sample ids without a file, files matching no sample to score).

    Raises:
        MSBError: unknown id rule; two samples share one name under the rule.
    """
    if id_rule not in ID_RULES:
        raise MSBError(f"--id-rule must be one of {', '.join(ID_RULES)}, not {id_rule!r}")
    key_of: dict[str, str] = {}
    for sid in sample_ids:
        if id_rule == "stem":
            key = sid
        else:
            col = "mask_path" if id_rule == "mask-name" else "image_path"
            key = Path(str(ds.row(sid)[col])).stem
        if key in key_of:
            raise MSBError(f"{ds.root / 'index.csv'}: samples {key_of[key]!r} and {sid!r} both have the name "
                           f"'{key}' under --id-rule {id_rule}; use another --id-rule")
        key_of[key] = sid
    matched = {key_of[k]: p for k, p in files.items() if k in key_of}
    missing = [s for s in sample_ids if s not in matched]
    extra = [p for k, p in files.items() if k not in key_of]
    return matched, missing, extra


def read_prediction(path: Path, n_classes: int) -> np.ndarray:
    """Read one prediction file as (C, H, W), values as stored (dtype kept).

    Raises:
        MSBError: unreadable file; a PNG for a dataset with several foreground classes; colour PNG with
            different channels; wrong number of dimensions or channels; an NPZ without a usable array.
    """
    path = Path(path)
    try:
        if path.suffix.lower() == ".png":
            from PIL import Image

            with Image.open(path) as im:
                arr = np.array(im)
            if arr.ndim == 3:  # grey saved as colour: equal channels, opaque alpha
                if arr.shape[2] in (2, 4) and not (arr[..., -1] == arr[..., -1].max()).all():
                    raise MSBError(f"{path}: PNG with a transparent alpha channel; save the map as grey")
                col = arr[..., : 3 if arr.shape[2] >= 3 else 1]
                if not (col == col[..., :1]).all():
                    raise MSBError(f"{path}: colour PNG with different channels; save the map as one grey channel")
                arr = col[..., 0]
            if arr.dtype == np.int32 and arr.size and arr.min() >= 0 and arr.max() <= 65535:
                arr = arr.astype(np.uint16)  # PIL's 'I' mode for 16-bit PNGs
        elif path.suffix.lower() == ".npy":
            arr = np.load(path, allow_pickle=False)
        else:
            with np.load(path, allow_pickle=False) as z:
                keys = [k for k in ("prob", "pred") if k in z.files] or (z.files if len(z.files) == 1 else [])
                if not keys:
                    raise MSBError(f"{path}: NPZ needs an array 'prob' or 'pred' (or exactly one array), has "
                                   f"{sorted(z.files)}")
                arr = z[keys[0]]
    except MSBError:
        raise
    except Exception as exc:  # noqa: BLE001 - PIL/numpy raise many types for a damaged file
        raise MSBError(f"{path}: cannot read the prediction ({type(exc).__name__}: {exc})") from None
    if path.suffix.lower() == ".png" and n_classes != 1:
        raise MSBError(f"{path}: a PNG holds one map but the dataset has {n_classes} foreground classes; give "
                       f"NPY/NPZ arrays of shape (C, H, W)")
    if arr.ndim == 2 and n_classes == 1:
        arr = arr[None]
    if arr.ndim != 3 or arr.shape[0] != n_classes:
        raise MSBError(f"{path}: prediction of shape {arr.shape}; expected (H, W) or ({n_classes}, H, W) for "
                       f"{n_classes} foreground class(es)")
    return arr


def to_probability(raw: np.ndarray, path: Path, sem: Semantics) -> np.ndarray:
    """Declared values -> float64 (C, H, W) probabilities in [0, 1] (binary masks -> {0, 1}).

    Raises:
        MSBError: a binary mask with other values than 0 and its foreground value; a probability map outside
            [0, 1] after scaling or with NaN; an integer map without a known scale (give ``--scale``).
    """
    if raw.dtype == bool:
        return raw.astype(np.float64)
    if sem.kind == "binary":
        values = np.unique(raw)
        fg = [v for v in values if v != 0]
        allowed = {1.0} | ({_AUTO_SCALE[raw.dtype]} if raw.dtype in _AUTO_SCALE else set())
        if sem.scale != "auto":
            allowed = {float(sem.scale)}
        if len(fg) > 1 or (fg and float(fg[0]) not in allowed):
            shown = ", ".join(f"{v:g}" for v in values[:6]) + (" ..." if len(values) > 6 else "")
            raise MSBError(f"{path}: not a binary mask: values {shown} (expected 0 and one of "
                           f"{sorted(allowed)}); declare --semantics probability for a probability map")
        return (raw != 0).astype(np.float64)
    if sem.scale != "auto":
        scale = float(sem.scale)
    elif raw.dtype in _AUTO_SCALE:
        scale = _AUTO_SCALE[raw.dtype]
    elif raw.dtype.kind == "f":
        scale = 1.0
    else:
        raise MSBError(f"{path}: integer map of dtype {raw.dtype} has no default scale; give --scale (the value "
                       f"that means probability 1)")
    p = raw.astype(np.float64) / scale
    if np.isnan(p).any() or (p.size and (p.min() < 0.0 or p.max() > 1.0)):
        raise MSBError(f"{path}: probability map outside [0, 1] after dividing by {scale:g} (range "
                       f"{np.nanmin(p):.4g}..{np.nanmax(p):.4g}{', NaN present' if np.isnan(p).any() else ''}); "
                       f"give the right --scale or rescale the maps")
    return p


def resize_map(p: np.ndarray, size: tuple[int, int], path: Path, sem: Semantics) -> np.ndarray:
    """Bring a (C, h, w) map to the native (H, W) by the declared rule.

    Raises:
        MSBError: the sizes differ and ``resize`` is ``none`` (names the file and both sizes).
    """
    if p.shape[-2:] == tuple(size):
        return p
    if sem.resize == "none":
        raise MSBError(f"{path}: prediction is {p.shape[-2]}x{p.shape[-1]} px but the image is {size[0]}x{size[1]} "
                       f"px; write it at the native size or pass --resize nearest|bilinear")
    import torch
    import torch.nn.functional as F

    t = torch.from_numpy(np.ascontiguousarray(p))[None]
    if sem.resize == "nearest":
        out = F.interpolate(t, size=size, mode="nearest")[0].numpy()
    else:
        out = F.interpolate(t, size=size, mode="bilinear", align_corners=False)[0].numpy()
        if sem.kind == "binary":
            out = (out >= 0.5).astype(np.float64)
    return np.clip(out, 0.0, 1.0)
