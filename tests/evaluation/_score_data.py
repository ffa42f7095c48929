"""Helpers of the ``msb score`` tests: tiny prepared datasets and prediction folders written into tmp_path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

from msb.data.classes import ClassSpec
from msb.data.schema import write_prepared_dataset


def write_dataset(root: Path, masks: dict[str, np.ndarray], splits: dict[str, str] | None = None,
                  mask_names: dict[str, str] | None = None) -> Path:
    """A binary prepared dataset (class 1 = ``lesion``, mask value 255) with grey images, in ``root``."""
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "masks").mkdir(parents=True, exist_ok=True)
    rows = []
    for sid, m in masks.items():
        name = (mask_names or {}).get(sid, sid)
        Image.fromarray((m.astype(np.uint8) * 255)).save(root / "masks" / f"{name}.png")
        Image.fromarray(np.full(m.shape + (3,), 90, np.uint8)).save(root / "images" / f"{name}.png")
        rows.append({"sample_id": sid, "image_path": f"images/{name}.png", "mask_path": f"masks/{name}.png",
                     "split": (splits or {}).get(sid, "test"), "group": sid, "height": m.shape[0],
                     "width": m.shape[1], "source": "t"})
    write_prepared_dataset(root, pd.DataFrame(rows), [ClassSpec(0, "background", (0,)),
                                                      ClassSpec(1, "lesion", (255,))])
    return root


def write_png(path: Path, arr: np.ndarray) -> Path:
    """Save a uint8 or uint16 grey array as PNG (PIL picks L or I;16)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr).save(path)
    return path
