"""Deterministic synthetic "polyp" dataset: the embedded default so the quickstart runs with no download.

Each sample is a small RGB frame of textured pinkish "mucosa" (low-frequency shading, fine grain, dark folds,
vignetting) with zero, one or two polyp-like blobs: irregular ellipses (boundary perturbed by smooth noise),
redder and darker than the background, with a bumpier texture, dome shading, a soft edge and sometimes a
specular highlight. Blob radii are drawn log-uniformly between 5 % and 30 % of the short side, so some are
small and some large. Colour and texture separate blob from background, but pixel noise, folds and per-video
colour shifts make a single colour threshold imperfect.

Frames are grouped into "videos" (``group`` = ``video_00`` ...): consecutive samples of one video share the
background colour, lighting and polyp layout (jittered per frame), so a random split that ignores ``group``
leaks near-duplicates, as with real video data. A fraction ``empty_fraction`` of frames has no blob
(empty mask).

Determinism: every random draw comes from ``numpy.random.default_rng(seed)`` in a fixed order, and files are
encoded with OpenCV's PNG writer at a fixed compression level, so the same arguments give byte-identical files
(with the same OpenCV build).
"""

from __future__ import annotations

import os
from pathlib import Path

import cv2
import numpy as np
import pandas as pd

from msb.data.converters.staging import ConversionReport, staged_output
from msb.data.schema import INDEX_COLUMNS, ClassSpec, load_prepared_dataset, write_prepared_dataset
from msb.errors import MSBError
from msb.utils.atomic import atomic_write_bytes

SOURCE_LABEL = "synthetic"
CLASSES = [ClassSpec(0, "background", (0,)), ClassSpec(1, "polyp", (255,))]


def _smooth_noise(rng: np.random.Generator, shape: tuple[int, int], cells: int) -> np.ndarray:
    """``(H, W)`` float32 smooth noise, zero mean and unit std, with about ``cells`` features per side."""
    g = rng.standard_normal((cells + 3, cells + 3)).astype(np.float32)
    h, w = shape
    up = cv2.resize(g, (w + 2 * w // cells, h + 2 * h // cells), interpolation=cv2.INTER_CUBIC)
    oy, ox = h // cells, w // cells
    up = up[oy:oy + h, ox:ox + w]
    return (up - up.mean()) / (up.std() + 1e-6)


def _video_params(rng: np.random.Generator) -> dict:
    """Per-video scene: background colour, lighting direction, polyp layout and colour."""
    base = np.array([0.86, 0.56, 0.56], np.float32) + rng.uniform(-0.05, 0.05, 3).astype(np.float32)
    n_blobs = int(rng.choice([1, 2], p=[0.6, 0.4]))
    blobs = []
    for _ in range(n_blobs):
        blobs.append({
            "cy": rng.uniform(0.2, 0.8), "cx": rng.uniform(0.2, 0.8),
            "r": float(np.exp(rng.uniform(np.log(0.05), np.log(0.30)))),
            "ratio": rng.uniform(0.6, 1.0), "angle": rng.uniform(0, np.pi),
        })
    polyp_tint = np.array([0.96, 0.72, 0.80], np.float32) * rng.uniform(0.9, 1.0)
    return {"base": base, "light": rng.uniform(0, 2 * np.pi), "blobs": blobs, "tint": polyp_tint,
            "n_folds": int(rng.integers(1, 4))}


def _render(rng: np.random.Generator, shape: tuple[int, int], video: dict, empty: bool
            ) -> tuple[np.ndarray, np.ndarray]:
    """Render one frame: ``(H, W, 3)`` uint8 RGB image and ``(H, W)`` uint8 mask in {0, 255}."""
    h, w = shape
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    yn, xn = yy / h - 0.5, xx / w - 0.5
    # background: colour, low-frequency shading, lighting gradient, grain, folds
    shade = 1.0 + 0.07 * _smooth_noise(rng, shape, 3) + 0.10 * (np.cos(video["light"]) * xn
                                                               + np.sin(video["light"]) * yn)
    grain = 0.035 * _smooth_noise(rng, shape, max(8, min(h, w) // 4))
    img = video["base"][None, None, :] * shade[..., None] + grain[..., None]
    for _ in range(video["n_folds"]):
        a, ph, fr = rng.uniform(0, np.pi), rng.uniform(0, 2 * np.pi), rng.uniform(2.0, 5.0)
        u = np.cos(a) * xn + np.sin(a) * yn
        v = -np.sin(a) * xn + np.cos(a) * yn
        dist = np.abs(u - 0.15 * np.sin(2 * np.pi * fr * v / 3 + ph) - rng.uniform(-0.35, 0.35))
        img *= (1.0 - 0.22 * np.exp(-(dist / 0.02) ** 2))[..., None]
    mask = np.zeros(shape, bool)
    if not empty:
        n = len(video["blobs"])
        keep = [0] if n == 1 else ([0, 1] if rng.random() < 0.75 else [int(rng.integers(0, 2))])
        for k in keep:
            b = video["blobs"][k]
            cy = np.clip(b["cy"] + rng.uniform(-0.08, 0.08), 0.1, 0.9) * h
            cx = np.clip(b["cx"] + rng.uniform(-0.08, 0.08), 0.1, 0.9) * w
            r = max(4.0, b["r"] * rng.uniform(0.8, 1.25) * min(h, w))
            ang = b["angle"] + rng.uniform(-0.3, 0.3)
            dy, dx = yy - cy, xx - cx
            u = (np.cos(ang) * dx + np.sin(ang) * dy) / r
            v = (-np.sin(ang) * dx + np.cos(ang) * dy) / (r * b["ratio"])
            d = np.sqrt(u * u + v * v) + 0.12 * _smooth_noise(rng, shape, 4)
            blob = d < 1.0
            if not blob.any():  # pragma: no cover - centre is inside the frame and r >= 4 px
                blob = (np.abs(yy - cy) < 2) & (np.abs(xx - cx) < 2)
            mask |= blob
            # polyp appearance: tint, dome shading, bumpy texture, soft edge, occasional highlight
            dome = np.clip(1.0 - d * d, 0.0, 1.0)
            bumps = 0.09 * _smooth_noise(rng, shape, max(6, int(2 * r / 3)))
            col = img * video["tint"][None, None, :] * (0.92 + 0.12 * dome + bumps)[..., None]
            alpha = cv2.GaussianBlur(blob.astype(np.float32), (0, 0), 0.8)[..., None]
            img = img * (1 - alpha) + col * alpha
            if rng.random() < 0.5:
                sy, sx = cy - 0.3 * r, cx - 0.2 * r
                spot = np.exp(-((yy - sy) ** 2 + (xx - sx) ** 2) / (2 * (0.08 * r + 0.8) ** 2))
                img += (0.35 * spot * blob)[..., None]
    vignette = 1.0 - 0.35 * (xn * xn + yn * yn) * 2
    img = img * vignette[..., None] + rng.normal(0.0, 0.015, img.shape).astype(np.float32)
    rgb = np.clip(np.rint(img * 255.0), 0, 255).astype(np.uint8)
    return rgb, (mask.astype(np.uint8) * 255)


def _png(arr: np.ndarray) -> bytes:
    ok, buf = cv2.imencode(".png", arr, [cv2.IMWRITE_PNG_COMPRESSION, 6])
    if not ok:  # pragma: no cover
        raise RuntimeError("PNG encoding failed")
    return buf.tobytes()


def make_synthetic_dataset(out: str | os.PathLike, n_samples: int = 120, size: tuple[int, int] = (96, 96),
                           seed: int = 0, empty_fraction: float = 0.1, n_groups: int | None = None,
                           with_splits: bool = False, overwrite: bool = False) -> ConversionReport:
    """Write a small deterministic synthetic polyp dataset as a prepared dataset at ``out``.

    Args:
        out: destination folder (built in a temporary sibling, renamed at the end).
        n_samples: number of frames (>= 1; >= 3 with ``with_splits``).
        size: ``(H, W)`` in pixels, each >= 16.
        seed: random seed; the same arguments give byte-identical files.
        empty_fraction: fraction of frames with an empty mask, in [0, 1]; exactly
            ``round(n_samples * empty_fraction)`` frames are empty.
        n_groups: number of "videos" (``group`` = ``video_00`` ...), 1..n_samples; consecutive frames share a
            video. ``None`` = ``min(12, n_samples)``.
        with_splits: fill ``split`` with a fixed group-aware train/val/test split (about 60/20/20 of the frames,
            whole videos per split, :func:`msb.data.splits.resolve_splits` with ``seed``); otherwise ``split``
            is empty and the run decides.
        overwrite: replace an existing non-empty ``out``.

    Returns:
        :class:`msb.data.converters.ConversionReport` (``n_changed_mask_pixels`` = 0).

    Output: ``images/synth_XXXX.png`` (RGB uint8), ``masks/synth_XXXX.png`` (uint8 {0, 255}), ``classes.csv``
    (0 background, 1 polyp = 255), ``index.csv`` with ``source`` = ``synthetic``.

    Raises:
        MSBError: invalid arguments (nothing is written) or existing non-empty ``out`` without ``overwrite``.
    """
    if isinstance(n_samples, bool) or not isinstance(n_samples, (int, np.integer)) or n_samples < 1:
        raise MSBError(f"n_samples must be a positive integer, got {n_samples!r}.")
    try:
        h, w = (int(size[0]), int(size[1]))
        if len(size) != 2:
            raise ValueError
    except (TypeError, ValueError, IndexError):
        raise MSBError(f"size must be (height, width) in pixels, got {size!r}.") from None
    if h < 16 or w < 16:
        raise MSBError(f"size must be at least 16x16 pixels, got {h}x{w}.")
    if not 0.0 <= float(empty_fraction) <= 1.0:
        raise MSBError(f"empty_fraction must be in [0, 1], got {empty_fraction!r}.")
    if n_groups is None:
        n_groups = min(12, int(n_samples))
    if isinstance(n_groups, bool) or not isinstance(n_groups, (int, np.integer)) or not 1 <= n_groups <= n_samples:
        raise MSBError(f"n_groups must be an integer in 1..n_samples ({n_samples}), got {n_groups!r}.")
    if with_splits and n_groups < 3:
        raise MSBError(f"with_splits needs at least 3 groups (one per train/val/test), got n_groups={n_groups}.")

    rng = np.random.default_rng(seed)
    videos = [_video_params(rng) for _ in range(n_groups)]
    n_empty = int(round(n_samples * float(empty_fraction)))
    empty = np.zeros(n_samples, bool)
    empty[rng.permutation(n_samples)[:n_empty]] = True
    rows, frames = [], []
    for i in range(n_samples):
        g = i * n_groups // n_samples
        rgb, mask = _render(rng, (h, w), videos[g], bool(empty[i]))
        sid = f"synth_{i:04d}"
        frames.append((sid, rgb, mask))
        rows.append({"sample_id": sid, "image_path": f"images/{sid}.png", "mask_path": f"masks/{sid}.png",
                     "split": "", "group": f"video_{g:02d}", "height": h, "width": w, "source": SOURCE_LABEL})
    index = pd.DataFrame(rows, columns=list(INDEX_COLUMNS))
    notes = [f"seed={seed}, {n_samples} frames of {h}x{w} px in {n_groups} videos (group column), "
             f"{n_empty} empty frame(s)"]
    if with_splits:
        from msb.data.splits import resolve_splits

        index["split"] = resolve_splits(index, mode="random", val_fraction=0.2, test_fraction=0.2, seed=seed,
                                        group_column="group").to_numpy()
        counts = index["split"].value_counts()
        notes.append("fixed group-aware split: " + ", ".join(f"{s}={int(counts.get(s, 0))}"
                                                            for s in ("train", "val", "test")))
    else:
        notes.append("split column empty: the run decides the split (use a group-aware split on 'group')")

    with staged_output(out, overwrite=overwrite) as tmp:
        for sid, rgb, mask in frames:
            atomic_write_bytes(tmp / "images" / f"{sid}.png", _png(np.ascontiguousarray(rgb[:, :, ::-1])))
            atomic_write_bytes(tmp / "masks" / f"{sid}.png", _png(mask))
        write_prepared_dataset(tmp, index, CLASSES)
        load_prepared_dataset(tmp, check_files=True)
    return ConversionReport(n_samples=n_samples, n_changed_mask_pixels=0, notes=notes,
                            out=Path(out).expanduser().absolute(), name="synthetic", n_mask_pixels=0)
