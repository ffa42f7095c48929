"""The screens' area-mean thumbnail (:mod:`msb.audit.area`) against independent references.

References: the overlap matrix of a 3 -> 2 resize by hand; the exact cell means from repeating every pixel
``size`` times along both axes and summing blocks (integers, no weights); OpenCV ``INTER_AREA`` itself, which
computes the same means in float32: equal where its integer-factor path is exact, within one grey level (and
equal in at least 99.9 % of the pixels) on real images, and used as is for images smaller than the thumbnail.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from msb.audit.area import area_matrix, area_thumbnail
from msb.audit.hashing import fingerprint

from .test_content_screens import area_mean_by_repetition


def test_area_matrix_by_hand() -> None:
    # 3 px into 2 cells of 1.5 px, in units of 1/2 px: cell 0 = pixel 0 (whole: 2) + half of pixel 1 (1)
    assert area_matrix(3, 2).tolist() == [[2.0, 0.0], [1.0, 1.0], [0.0, 2.0]]
    m = area_matrix(622, 64)
    assert np.all(m.sum(axis=0) == 622) and np.all(m.sum(axis=1) == 64)


@pytest.mark.parametrize("h,w,size", [(64, 64, 64), (65, 64, 64), (530, 622, 64), (120, 160, 64), (97, 333, 16),
                                      (288, 384, 96), (1000, 70, 64)])
def test_area_thumbnail_equals_cell_means_by_repetition(h: int, w: int, size: int) -> None:
    rng = np.random.default_rng(h * 1000 + w)
    grey = rng.integers(0, 256, (h, w), dtype=np.uint8)
    grey[: h // 3] = 255  # saturated rows: the largest sums
    got = area_thumbnail(grey, size)
    assert got.dtype == np.uint8 and got.shape == (size, size)
    assert np.array_equal(got, area_mean_by_repetition(grey, size))


@pytest.mark.parametrize("h,w", [(128, 128), (192, 128), (96, 128), (512, 320), (384, 256)])
def test_exact_ties_on_both_paths(h: int, w: int) -> None:
    # two grey levels, cells of an even number of (whole or halved) pixels: many means are exactly k + 1/2
    # (below 256 px: OpenCV's float64 means and the exact recomputation of the ties)
    rng = np.random.default_rng(h + w)
    grey = (rng.random((h, w)) < 0.5).astype(np.uint8) * np.uint8(rng.integers(1, 4))
    ref = area_mean_by_repetition(grey, 64)
    rows = np.repeat(grey.astype(np.int64), 64, axis=0).reshape(64, h, w).sum(axis=1)
    sums = np.repeat(rows, 64, axis=1).reshape(64, 64, w).sum(axis=2)
    assert (2 * (sums % (h * w)) == h * w).sum() > 0  # precondition: exact ties occur
    assert np.array_equal(area_thumbnail(grey, 64), ref)


def test_area_thumbnail_ties_round_half_to_even() -> None:
    grey = np.array([[0, 1], [0, 0]], dtype=np.uint8)  # 4 px into 1: mean 0.25 -> 0
    assert area_thumbnail(grey, 1)[0, 0] == 0
    grey = np.array([[1, 2, 2], [1, 2, 1]], dtype=np.uint8)  # mean 1.5 -> 2
    assert area_thumbnail(grey, 1)[0, 0] == 2 == cv2.resize(grey, (1, 1), interpolation=cv2.INTER_AREA)[0, 0]
    grey = np.array([[2, 3, 3], [2, 3, 2]], dtype=np.uint8)  # mean 2.5 -> 2
    assert area_thumbnail(grey, 1)[0, 0] == 2 == cv2.resize(grey, (1, 1), interpolation=cv2.INTER_AREA)[0, 0]


def test_integer_factors_equal_opencv() -> None:
    # 4x and 3x: OpenCV's integer-factor path, rounding half to even (cvRound) as here
    grey = np.random.default_rng(3).integers(0, 256, (256, 192), dtype=np.uint8)
    assert np.array_equal(area_thumbnail(grey, 64), cv2.resize(grey, (64, 64), interpolation=cv2.INTER_AREA))


def test_smaller_than_the_thumbnail_is_opencv_itself() -> None:
    grey = np.random.default_rng(4).integers(0, 256, (40, 100), dtype=np.uint8)
    assert np.array_equal(area_thumbnail(grey, 64), cv2.resize(grey, (64, 64), interpolation=cv2.INTER_AREA))


@pytest.mark.shared_data
def test_real_images_match_opencv_within_one_grey_level(shared_dir: Path) -> None:
    files = sorted((shared_dir / "data").glob("*/images/*"))[::25]
    if not files:
        pytest.skip(f"{shared_dir / 'data'}: no shared images")
    equal = total = 0
    for f in files:
        grey = np.asarray(Image.open(f).convert("L"))
        ours = area_thumbnail(grey, 64)
        ref = cv2.resize(grey, (64, 64), interpolation=cv2.INTER_AREA)
        assert np.abs(ours.astype(int) - ref).max() <= 1, f
        equal += int((ours == ref).sum())
        total += ours.size
        assert np.array_equal(fingerprint(f).thumb, ours), f  # the fingerprint's thumbnail is this one
    assert equal / total >= 0.999


@pytest.mark.parametrize("h,w", [(1072, 1920), (1100, 1000), (1024, 1024), (2000, 600)])
def test_strip_path_equals_pillow_and_the_cell_means(h: int, w: int) -> None:
    # from 1 Mpx the three horizontal passes run over row strips (msb.audit.resize); (2000, 600) is tall: Pillow
    # runs the vertical pass first there, so the whole-image path is taken
    from msb.audit.resize import STRIP_FROM, fingerprint_resizes

    assert h * w >= STRIP_FROM
    grey = np.random.default_rng(h + w).integers(0, 256, (h, w), dtype=np.uint8)
    grey[: h // 4] = 255
    p32, d98, thumb = fingerprint_resizes(grey, 64)
    im = Image.fromarray(grey)
    assert np.array_equal(p32, np.asarray(im.resize((32, 32), Image.Resampling.LANCZOS)))
    assert np.array_equal(d98, np.asarray(im.resize((9, 8), Image.Resampling.LANCZOS)))
    assert np.array_equal(thumb, area_mean_by_repetition(grey, 64))
