"""The three resizes of one fingerprint (:mod:`msb.audit.hashing`): pHash's 32x32 and dHash's 9x8 LANCZOS inputs
(:mod:`msb.audit.lanczos`) and the screens' area-mean thumbnail (:mod:`msb.audit.area`), in one pass over a large
image.

From :data:`STRIP_FROM` pixels, when Pillow runs the horizontal pass first for both hash sizes, the three
horizontal passes read the grey image in strips of :data:`STRIP_ROWS` rows: each strip is copied to float64 once
(``128 x W x 8`` bytes: about 2 MB at 1,920 px, the size of a core's L2 cache) and multiplied by the banded
matrices of all three passes while it is in cache. Each sum is the same integer sum as in the whole-image products
(exact in float64), so the values are bit-identical; only the memory traffic differs (a 1,920 x 1,072 image: 11.8
ms -> 4.0 ms for the three passes, one thread; 995 x 1,280: 6.8 -> 3.4 ms; below 1 Mpx the whole-image products
are faster, 530 x 622: 0.76 ms against 0.93 ms in strips). Smaller images,
tall ones (vertical pass first) and the PIL fallback take :func:`msb.audit.lanczos.lanczos_hash_inputs` and
:func:`msb.audit.area.area_thumbnail` on one float64 copy.
"""

from __future__ import annotations

import numpy as np

from msb.audit.area import area_bands, area_from_rows, area_thumbnail
from msb.audit.lanczos import (DHASH_SIZE, PHASH_SIDE, fast_resize_matches_pillow, float_buffer, lanczos_bands,
                               lanczos_hash_inputs, round_clip, vertical_first, vertical_pass)

STRIP_FROM = 1 << 20  # pixels (H x W) from which the horizontal passes run in row strips
STRIP_ROWS = 128  # rows per strip


def fingerprint_resizes(grey: np.ndarray, thumb_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """pHash and dHash LANCZOS inputs and the area-mean thumbnail of one grey image.

    Args:
        grey: ``(H, W)`` ``uint8`` grey image.
        thumb_size: thumbnail side in pixels.

    Returns:
        ``(32, 32)`` and ``(8, 9)`` float64 of integers in ``[0, 255]`` (bit-identical to ``PIL.Image.resize(...,
        LANCZOS)``, as :func:`msb.audit.lanczos.lanczos_hash_inputs`) and the ``(thumb_size, thumb_size)``
        ``uint8`` thumbnail of :func:`msb.audit.area.area_thumbnail`.
    """
    h, w = grey.shape
    if (h * w < STRIP_FROM or h < thumb_size or w < thumb_size or 255.0 * h * w >= 2.0**53
            or not fast_resize_matches_pillow() or vertical_first(h, w, PHASH_SIDE, PHASH_SIDE)
            or vertical_first(h, w, DHASH_SIZE[1], DHASH_SIZE[0])):
        g = float_buffer(grey)  # one float64 copy, read by both resizes while in cache
        return (*lanczos_hash_inputs(grey, g), area_thumbnail(grey, thumb_size, g))
    passes = (lanczos_bands(w, PHASH_SIDE), lanczos_bands(w, DHASH_SIZE[0]), area_bands(w, thumb_size))
    outs = [np.empty((h, PHASH_SIDE)), np.empty((h, DHASH_SIZE[0])), np.empty((h, thumb_size))]
    for s in range(0, h, STRIP_ROWS):
        x = float_buffer(grey[s:s + STRIP_ROWS])
        for bands, out in zip(passes, outs):
            for c0, c1, r0, r1, sub in bands:
                out[s:s + STRIP_ROWS, c0:c1] = x[:, r0:r1] @ sub
    p32 = vertical_pass(round_clip(outs[0]), PHASH_SIDE)
    d98 = vertical_pass(round_clip(outs[1]), DHASH_SIZE[1])
    return p32, d98, area_from_rows(outs[2], w, thumb_size)


__all__ = ["fingerprint_resizes", "STRIP_FROM", "STRIP_ROWS"]
