"""Deterministic multi-class synthetic dataset with patient groups: the stand-in for NeoPolyp (2 foreground
classes) and CAMUS (3 foreground classes) in CI studies (configs/protocols/msb_case_study_paper_ci.yaml).

Each frame is a textured RGB background with one filled region per foreground class, drawn in class order so
that a later class may cover an earlier one:

* ``layout="blobs"`` (NeoPolyp-like): each class is an irregular ellipse (boundary perturbed by smooth noise)
  with its own colour tint; a frame shows every class with probability ``1 - absent_fraction`` each, so frames
  hold one, both or (rarely) no class;
* ``layout="nested"`` (CAMUS-like, needs 3 classes): class 1 an ellipse ("cavity"), class 2 a ring around it
  ("myocardium"), class 3 an ellipse below it ("atrium"), every class present in every frame.

Frames are grouped into "patients" (``group`` = ``patient_00`` ...): consecutive frames of one patient share the
background colour and the layout (jittered per frame), so a split that ignores ``group`` leaks. Masks are PNG
with the class ids ``0..n_classes`` as values (``classes.csv``: value k -> class k).

Determinism: every random draw comes from ``numpy.random.default_rng(seed)`` in a fixed order; files are encoded
with OpenCV's PNG writer at a fixed level, so the same arguments give byte-identical files.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import cv2
import numpy as np
import pandas as pd

from msb.data.converters.staging import ConversionReport, staged_output
from msb.data.schema import INDEX_COLUMNS, ClassSpec, load_prepared_dataset, write_prepared_dataset
from msb.data.synth import _smooth_noise
from msb.errors import MSBError
from msb.utils.atomic import atomic_write_bytes

__all__ = ["make_multiclass_synthetic"]

SOURCE_LABEL = "synthetic-multiclass"
_TINTS = np.array([[1.25, 0.55, 0.55], [0.55, 1.2, 0.6], [0.6, 0.6, 1.3], [1.2, 1.15, 0.5]], np.float32)


def _ellipse(yy: np.ndarray, xx: np.ndarray, cy: float, cx: float, ry: float, rx: float, ang: float,
             noise: np.ndarray) -> np.ndarray:
    dy, dx = yy - cy, xx - cx
    u = (np.cos(ang) * dx + np.sin(ang) * dy) / rx
    v = (-np.sin(ang) * dx + np.cos(ang) * dy) / ry
    return np.sqrt(u * u + v * v) + noise < 1.0


def _patient(rng: np.random.Generator, n_classes: int) -> dict:
    return {"base": rng.uniform(0.35, 0.6, 3).astype(np.float32),
            "centres": rng.uniform(0.3, 0.7, (n_classes, 2)), "radii": rng.uniform(0.12, 0.22, (n_classes, 2)),
            "angles": rng.uniform(0, np.pi, n_classes)}


def _render(rng: np.random.Generator, shape: tuple[int, int], p: dict, n_classes: int, layout: str,
            absent_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """One frame: ``(H, W, 3)`` uint8 RGB and ``(H, W)`` uint8 labels in ``0..n_classes``."""
    h, w = shape
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    img = p["base"][None, None, :] * (1.0 + 0.08 * _smooth_noise(rng, shape, 3))[..., None]
    labels = np.zeros(shape, np.uint8)
    s = min(h, w)
    jit = rng.uniform(-0.05, 0.05, (n_classes, 2))
    noise = 0.1 * _smooth_noise(rng, shape, 4)
    for k in range(n_classes):
        cy, cx = (p["centres"][k] + jit[k]) * (h, w)
        ry, rx = np.maximum(p["radii"][k] * s * rng.uniform(0.85, 1.15), 3.0)
        if layout == "nested":
            cy0, cx0 = (p["centres"][0] + jit[0]) * (h, w)
            ry0, rx0 = np.maximum(p["radii"][0] * s, 3.0)
            if k == 0:
                region = _ellipse(yy, xx, cy0, cx0, ry0, rx0, p["angles"][0], noise)
            elif k == 1:
                region = _ellipse(yy, xx, cy0, cx0, ry0 * 1.35, rx0 * 1.35, p["angles"][0], noise) & (labels == 0)
            else:
                region = _ellipse(yy, xx, min(cy0 + 1.7 * ry0, 0.92 * h), cx0, ry0 * 0.6, rx0 * 0.8, 0.0, noise)
                region &= labels == 0
        else:
            if rng.random() < absent_fraction:
                continue
            region = _ellipse(yy, xx, cy, cx, ry, rx, p["angles"][k], noise)
        labels[region] = k + 1
        tex = 1.0 + 0.1 * _smooth_noise(rng, shape, max(4, s // 6))
        col = img * _TINTS[k % len(_TINTS)][None, None, :] * tex[..., None]
        alpha = cv2.GaussianBlur(region.astype(np.float32), (0, 0), 0.8)[..., None]
        img = img * (1 - alpha) + col * alpha
    img = img + rng.normal(0.0, 0.02, img.shape).astype(np.float32)
    return np.clip(np.rint(img * 255.0), 0, 255).astype(np.uint8), labels


def make_multiclass_synthetic(out: str | os.PathLike, n_samples: int = 40, size: Sequence[int] = (64, 64),
                              seed: int = 0, class_names: Sequence[str] = ("class_1", "class_2"),
                              layout: str = "blobs", n_groups: int | None = None, absent_fraction: float = 0.2,
                              overwrite: bool = False) -> ConversionReport:
    """Write the multi-class synthetic dataset (module docstring) as a prepared dataset at ``out``.

    Args:
        out: destination folder (built in a temporary sibling, renamed at the end).
        n_samples: frames (>= 1); size: ``(H, W)`` px, each >= 16; seed: random seed.
        class_names: foreground class names (1-4 classes; ``nested`` needs exactly 3), ids 1, 2, ... in order.
        layout: ``blobs`` or ``nested``.
        n_groups: patients (``group`` = ``patient_00`` ...), 1..n_samples; default ``min(10, n_samples)``.
        absent_fraction: ``blobs``: probability that a class is absent from a frame, in [0, 1].
        overwrite: replace an existing non-empty ``out``.

    Returns:
        :class:`msb.data.converters.ConversionReport` (``n_changed_mask_pixels`` = 0).

    Raises:
        MSBError: invalid arguments (nothing is written) or an existing non-empty ``out`` without ``overwrite``.
    """
    names = [str(n) for n in class_names]
    if not 1 <= len(names) <= len(_TINTS) or len(set(names)) != len(names) or "background" in names:
        raise MSBError(f"class_names must be 1-{len(_TINTS)} distinct names other than 'background', got {names}.")
    if layout not in ("blobs", "nested") or (layout == "nested" and len(names) != 3):
        raise MSBError(f"layout must be 'blobs' or 'nested' (nested: exactly 3 classes), got {layout!r} with "
                       f"{len(names)} class(es).")
    if isinstance(n_samples, bool) or not isinstance(n_samples, (int, np.integer)) or n_samples < 1:
        raise MSBError(f"n_samples must be a positive integer, got {n_samples!r}.")
    h, w = (int(size[0]), int(size[1]))
    if h < 16 or w < 16:
        raise MSBError(f"size must be at least 16x16 pixels, got {h}x{w}.")
    if not 0.0 <= float(absent_fraction) <= 1.0:
        raise MSBError(f"absent_fraction must be in [0, 1], got {absent_fraction!r}.")
    n_groups = min(10, int(n_samples)) if n_groups is None else n_groups
    if isinstance(n_groups, bool) or not isinstance(n_groups, (int, np.integer)) or not 1 <= n_groups <= n_samples:
        raise MSBError(f"n_groups must be an integer in 1..n_samples ({n_samples}), got {n_groups!r}.")
    rng = np.random.default_rng(seed)
    patients = [_patient(rng, len(names)) for _ in range(n_groups)]
    rows, frames = [], []
    for i in range(n_samples):
        g = i * n_groups // n_samples
        rgb, labels = _render(rng, (h, w), patients[g], len(names), layout, float(absent_fraction))
        sid = f"mc_{i:04d}"
        frames.append((sid, rgb, labels))
        rows.append({"sample_id": sid, "image_path": f"images/{sid}.png", "mask_path": f"masks/{sid}.png",
                     "split": "", "group": f"patient_{g:02d}", "height": h, "width": w, "source": SOURCE_LABEL})
    classes = [ClassSpec(0, "background", (0,))] + [ClassSpec(k, n, (k,)) for k, n in enumerate(names, 1)]
    with staged_output(out, overwrite=overwrite) as tmp:
        for sid, rgb, labels in frames:
            for sub, arr in (("images", np.ascontiguousarray(rgb[:, :, ::-1])), ("masks", labels)):
                ok, buf = cv2.imencode(".png", arr, [cv2.IMWRITE_PNG_COMPRESSION, 6])
                if not ok:  # pragma: no cover
                    raise MSBError(f"PNG encoding of {sid} failed")
                atomic_write_bytes(tmp / sub / f"{sid}.png", buf.tobytes())
        write_prepared_dataset(tmp, pd.DataFrame(rows, columns=list(INDEX_COLUMNS)), classes)
        load_prepared_dataset(tmp, check_files=True)
    per_class = np.bincount(np.concatenate([f[2].ravel() for f in frames]), minlength=len(names) + 1)
    notes = [f"seed={seed}, {n_samples} frames of {h}x{w} px, layout {layout}, {n_groups} patients (group column)",
             "pixels per class: " + ", ".join(f"{c.name} {int(n):,}" for c, n in zip(classes, per_class))]
    return ConversionReport(n_samples=n_samples, n_changed_mask_pixels=0, notes=notes,
                            out=Path(out).expanduser().absolute(), name="synthetic-multiclass")
