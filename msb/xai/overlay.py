"""Overlay figures for Grad-CAM: image | prediction (filled) with the reference outline | CAM heat map."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from msb.utils.atomic import atomic_path

__all__ = ["render_overlay"]


def render_overlay(image: np.ndarray, pred: np.ndarray, cam: np.ndarray, out_path: str | Path, title: str,
                   class_names: Sequence[str], ref: np.ndarray | None = None) -> Path:
    """Write a PNG with one row per foreground class and three panels: the image; the image with the
    predicted mask (red, 40 % opacity) and the reference outline (green); the image with the CAM (``jet``
    colour map, 50 % opacity, colour bar 0..1).

    Args:
        image: uint8 (H, W, 3) RGB at native size.
        pred: bool (C, H, W) predicted masks.
        cam: float (C, H, W) in [0, 1].
        out_path: PNG destination (written atomically).
        title: figure title (run, fold, checkpoint, target layers).
        class_names: C names.
        ref: optional bool (C, H, W) reference masks.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = cam.shape[0]
    h, w = image.shape[:2]
    panel = 3.0  # inches per panel width
    fig, axes = plt.subplots(n, 3, figsize=(3 * panel + 0.6, n * panel * h / w + 0.6), dpi=120, squeeze=False)
    for c in range(n):
        a0, a1, a2 = axes[c]
        a0.imshow(image)
        a0.set_title("image" if n == 1 else f"image ({class_names[c]})", fontsize=8)
        a1.imshow(image)
        overlay = np.zeros((h, w, 4), dtype=np.float32)
        overlay[pred[c]] = (1.0, 0.0, 0.0, 0.4)
        a1.imshow(overlay)
        if ref is not None and ref[c].any() and not ref[c].all():
            a1.contour(ref[c].astype(np.float32), levels=[0.5], colors=["lime"], linewidths=0.8)
        a1.set_title(f"prediction ({class_names[c]}, red)" + (", reference (green)" if ref is not None else ""),
                     fontsize=8)
        a2.imshow(image)
        im = a2.imshow(cam[c], cmap="jet", alpha=0.5, vmin=0.0, vmax=1.0)
        a2.set_title("Grad-CAM", fontsize=8)
        fig.colorbar(im, ax=a2, fraction=0.046, pad=0.02)
        for a in (a0, a1, a2):
            a.set_axis_off()
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    out_path = Path(out_path)
    with atomic_path(out_path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    return out_path
