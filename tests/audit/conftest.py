"""Fixtures for the audit tests: a small prepared dataset with planted duplicates across splits.

Layout (12 rows; images are smooth random colour fields, pairwise pHash/dHash distance >= 21 bits between
unrelated images, checked in the tests):

======== ===== ============================= =======================================================
sample   split image file                    planted relation
======== ===== ============================= =======================================================
a        train images/train/a.png            original of ``copy_a``
b        train images/train/b.png            original of ``b_small``
c        train images/train/c.png            original of ``c_shift`` (group ``patient3``)
d        train images/train/d.png            byte copy ``d_dup`` in the same split (does not cross)
d_dup    train images/train/d_dup.png        byte copy of d
e        train images/train/e.png            group ``patient7`` with f (crosses train/val)
b_small  val   images/val/b.jpg              b resized to 75 % (INTER_AREA) and re-encoded as JPEG q85
f        val   images/val/f.png              group ``patient7``
copy_a   test  images/test/copy_of_a.png     byte-identical copy of a under another name
c_shift  test  images/test/shifted_c.png     c shifted right by 1 px (first column repeated)
g        test  images/test/g.png             group ``patient9`` with h (same split)
h        test  images/test/h.png             group ``patient9``
======== ===== ============================= =======================================================
"""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import cv2
import numpy as np
import pandas as pd
import pytest
from scipy import ndimage

from msb.data.schema import ClassSpec, write_prepared_dataset

ROWS = [  # sample_id, split, image_path, group
    ("a", "train", "images/train/a.png", ""),
    ("b", "train", "images/train/b.png", ""),
    ("c", "train", "images/train/c.png", "patient3"),
    ("d", "train", "images/train/d.png", ""),
    ("d_dup", "train", "images/train/d_dup.png", ""),
    ("e", "train", "images/train/e.png", "patient7"),
    ("b_small", "val", "images/val/b.jpg", ""),
    ("f", "val", "images/val/f.png", "patient7"),
    ("copy_a", "test", "images/test/copy_of_a.png", ""),
    ("c_shift", "test", "images/test/shifted_c.png", ""),
    ("g", "test", "images/test/g.png", "patient9"),
    ("h", "test", "images/test/h.png", "patient9"),
]


def smooth_image(seed: int, hw: tuple[int, int] = (96, 128)) -> np.ndarray:
    """(H, W, 3) uint8 smooth random colour field (Gaussian-filtered noise, sigma 6 px), RGB."""
    rng = np.random.default_rng(seed)
    f = np.stack([ndimage.gaussian_filter(rng.normal(size=hw), 6) for _ in range(3)], -1)
    f = (f - f.min()) / (f.max() - f.min()) * 255
    return f.astype(np.uint8)


def write_rgb(path: Path, rgb: np.ndarray, params: list[int] | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    assert cv2.imwrite(str(path), rgb[:, :, ::-1], params or [])


def build_planted(root: Path) -> Path:
    """Write the planted dataset (table in the module docstring) into ``root``; returns ``root``."""
    originals = {"a": 0, "b": 1, "c": 2, "d": 3, "e": 4, "f": 5, "g": 6, "h": 7}
    for sid, seed in originals.items():
        split = dict((r[0], r[1]) for r in ROWS)[sid]
        write_rgb(root / "images" / split / f"{sid}.png", smooth_image(seed))
    shutil.copyfile(root / "images/train/a.png", root / "images/test/copy_of_a.png")
    shutil.copyfile(root / "images/train/d.png", root / "images/train/d_dup.png")
    small = cv2.resize(smooth_image(1), (96, 72), interpolation=cv2.INTER_AREA)
    write_rgb(root / "images/val/b.jpg", small, [cv2.IMWRITE_JPEG_QUALITY, 85])
    c = smooth_image(2)
    write_rgb(root / "images/test/shifted_c.png", np.concatenate([c[:, :1], c[:, :-1]], axis=1))
    rows = []
    (root / "masks").mkdir()
    for sid, split, img, group in ROWS:
        h, w = cv2.imread(str(root / img)).shape[:2]
        m = np.zeros((h, w), np.uint8)
        m[h // 4: h // 2, w // 4: w // 2] = 255
        assert cv2.imwrite(str(root / "masks" / f"{sid}.png"), m)
        rows.append({"sample_id": sid, "image_path": img, "mask_path": f"masks/{sid}.png", "split": split,
                     "group": group, "height": h, "width": w, "source": "planted"})
    write_prepared_dataset(root, pd.DataFrame(rows), [ClassSpec(0, "background", (0,)), ClassSpec(1, "blob", (255,))])
    return root


@pytest.fixture(scope="session")
def helpers() -> SimpleNamespace:
    """The builders above (test modules cannot import conftest under --import-mode=importlib)."""
    return SimpleNamespace(rows=ROWS, smooth_image=smooth_image, write_rgb=write_rgb, build_planted=build_planted)


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> Path:
    """A fresh planted dataset per test module (tests must not modify it)."""
    return build_planted(tmp_path_factory.mktemp("planted") / "ds")


@pytest.fixture(scope="module")
def planted_result(planted):
    """``run_audit`` of the planted dataset with default settings."""
    from msb.audit.core import run_audit

    return run_audit(planted)
