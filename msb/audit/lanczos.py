"""Pillow's LANCZOS resize, bit for bit, as matrix products: the pHash (32x32) and dHash (9x8) inputs.

imagehash resizes the grey image with ``PIL.Image.resize(..., LANCZOS)``. Pillow's fixed-point arithmetic
(``src/libImaging/Resample.c``: ``precompute_coeffs``, coefficients rounded to 22 fractional bits, each pass
rounded and clipped to 8 bit) is written here as two matrix products per size (banded: blocks of 4 outputs from
256 input samples; below, both sizes share their products). Every product and sum is an integer below 2**53, so
float64 BLAS computes it exactly. The order of the two passes is the installed Pillow's, checked once on probe
images (:func:`fast_resize_matches_pillow`); if it ever differs, PIL's own resize is used.
"""

from __future__ import annotations

import math
import threading
from functools import lru_cache

import numpy as np
from PIL import Image

PHASH_SIDE = 32  # imagehash.phash: hash_size 8 x highfreq_factor 4
DHASH_SIZE = (9, 8)  # imagehash.dhash: (hash_size + 1) wide x hash_size high

_PRECISION_BITS = 22  # Pillow's PRECISION_BITS for 8-bit images: 32 - 8 - 2
_HALF = float(1 << (_PRECISION_BITS - 1))
_INV_ONE = 1.0 / (1 << _PRECISION_BITS)
_BANDED_FROM = 256  # input samples from which a pass is cut into blocks of 4 output samples
_BLOCK = 4  # output samples per block of a banded pass
_LANCZOS = Image.Resampling.LANCZOS


def _sinc(x: np.ndarray) -> np.ndarray:
    """Pillow's ``sinc_filter``: ``sin(pi x) / (pi x)``, 1 at 0. ``np.sin`` must equal the C library's ``sin``
    that Pillow calls; :func:`fast_resize_matches_pillow` checks it (``math.sin``) before the fast path is used."""
    xp = x * math.pi
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(x == 0.0, 1.0, np.sin(xp) / xp)


@lru_cache(maxsize=512)
def lanczos_matrix(n_in: int, n_out: int) -> np.ndarray:
    """Pillow's LANCZOS weights of one resize pass as an ``(n_in, n_out)`` float64 matrix of integers.

    Column ``j`` holds the fixed-point weights (``trunc(w * 2**22 ± 0.5)``, halves away from zero) of output
    sample ``j`` over the input samples, as ``precompute_coeffs`` + ``normalize_coeffs_8bpc`` in Pillow's
    ``Resample.c`` compute them: ``scale = n_in / n_out``, support ``3 * max(scale, 1)``, centre
    ``(j + 0.5) * scale``, taps ``lanczos((i - centre + 0.5) / max(scale, 1))`` with ``lanczos(x) = sinc(x)
    sinc(x / 3)`` on ``[-3, 3)``, divided by their sum (added left to right, ``np.cumsum``). The same IEEE
    operations in the same order, so the weights are bit-identical (tests compare a plain loop transcription).
    ``n_in == n_out`` gives ``2**22 * I`` (Pillow skips that pass; the result is equal). Read-only (cached).
    """
    m = np.zeros((n_in, n_out))
    if n_in == n_out:
        np.fill_diagonal(m, float(1 << _PRECISION_BITS))
        m.flags.writeable = False
        return m
    scale = float(n_in) / n_out
    filterscale = max(scale, 1.0)
    support = 3.0 * filterscale
    ss = 1.0 / filterscale
    center = (np.arange(n_out) + 0.5) * scale
    xmin = np.maximum(np.trunc(center - support + 0.5).astype(np.int64), 0)
    count = np.minimum(np.trunc(center + support + 0.5).astype(np.int64), n_in) - xmin
    taps = np.arange(int(count.max()))
    valid = taps[None, :] < count[:, None]
    arg = (((taps[None, :] + xmin[:, None]).astype(np.float64) - center[:, None]) + 0.5) * ss
    inside = (arg >= -3.0) & (arg < 3.0)
    w = np.where(valid & inside, _sinc(arg) * _sinc(arg / 3), 0.0)
    ww = np.cumsum(w, axis=1)[:, -1]  # sequential, as the C loop (trailing zeros change nothing)
    w = np.where(ww[:, None] != 0.0, w / np.where(ww == 0.0, 1.0, ww)[:, None], w)
    fixed = np.trunc(w * float(1 << _PRECISION_BITS) + np.where(w < 0, -0.5, 0.5))
    rows, cols = np.nonzero(valid)
    m[xmin[rows] + taps[cols], rows] = fixed[rows, cols]
    m.flags.writeable = False
    return m


def round_clip(s: np.ndarray) -> np.ndarray:
    """Pillow's ``clip8(ss + 2**21)``: ``floor((s + 2**21) / 2**22)`` clipped to ``[0, 255]`` (exact in float64).
    Works in place on ``s`` (a fresh product) and returns it."""
    s += _HALF
    s *= _INV_ONE
    np.floor(s, out=s)
    np.maximum(s, 0.0, out=s)
    return np.minimum(s, 255.0, out=s)


@lru_cache(maxsize=1024)
def lanczos_bands(n_in: int, n_out: int) -> tuple[tuple[int, int, int, int, np.ndarray], ...]:
    """:func:`lanczos_matrix` cut into blocks of output samples with the input span each block reads.

    Each block is ``(c0, c1, r0, r1, weights[r0:r1, c0:c1])``: outputs ``c0:c1`` read only inputs ``r0:r1``.
    From 256 input samples the outputs are cut in blocks of 4, so the products skip most zeros of the banded
    matrix; below, one dense block (fewer, larger products cost less there).
    """
    return band_blocks(lanczos_matrix(n_in, n_out), _BLOCK if n_in >= _BANDED_FROM else n_out)


def band_blocks(k: np.ndarray, block: int) -> tuple[tuple[int, int, int, int, np.ndarray], ...]:
    """A banded resize matrix cut into blocks of output columns, each with the span of input rows it reads.

    Args:
        k: ``(n_in, n_out)`` float64 weights (:func:`lanczos_matrix`, :func:`msb.audit.area.area_matrix`), every
            column with at least one non-zero.
        block: output columns per block (``>= 1``; ``n_out`` gives one dense block).

    Returns:
        Tuple of ``(c0, c1, r0, r1, k[r0:r1, c0:c1])`` (contiguous, read-only): ``x[:, r0:r1] @ sub`` gives
        outputs ``c0:c1`` without multiplying the zeros outside the band.

    Raises:
        IndexError: a block whose columns are all zero (no resize matrix has one).
    """
    blocks = []
    for c0 in range(0, k.shape[1], block):
        c1 = min(k.shape[1], c0 + block)
        rows = np.flatnonzero(np.any(k[:, c0:c1] != 0, axis=1))
        r0, r1 = int(rows[0]), int(rows[-1]) + 1
        sub = np.ascontiguousarray(k[r0:r1, c0:c1])
        sub.flags.writeable = False
        blocks.append((c0, c1, r0, r1, sub))
    return tuple(blocks)


def _horizontal_pass(g: np.ndarray, n_out: int) -> np.ndarray:
    """One horizontal LANCZOS pass of a float64 ``(H, W)`` image to ``(H, n_out)``, rounded and clipped."""
    out = np.empty((g.shape[0], n_out))
    for c0, c1, r0, r1, sub in lanczos_bands(g.shape[1], n_out):
        out[:, c0:c1] = g[:, r0:r1] @ sub
    return round_clip(out)


def vertical_pass(g: np.ndarray, n_out: int) -> np.ndarray:
    """One vertical LANCZOS pass of a float64 ``(H, W)`` image to ``(n_out, W)``, rounded and clipped."""
    out = np.empty((n_out, g.shape[1]))
    for c0, c1, r0, r1, sub in lanczos_bands(g.shape[0], n_out):
        out[c0:c1] = sub.T @ g[r0:r1]
    return round_clip(out)


def vertical_first(h: int, w: int, oh: int, ow: int, order: str | None = None) -> bool:
    """Pass order of the installed Pillow (13.x): vertical first iff ``2 * max(w - ow, 0) < max(h - oh, 0)``.

    Pillow's C source is not shipped with the wheel; the rule was read off its output (it reproduces every one
    of ~4,000 random shapes where the two orders differ) and :func:`fast_resize_matches_pillow` checks it (and
    the horizontal-first order of Pillow <= 12) against the installed Pillow before the fast path is used.
    """
    if (order or _ORDER) == "horizontal-first":
        return False
    return 2 * max(w - ow, 0) < max(h - oh, 0)


def pillow_lanczos(grey: np.ndarray, width: int, height: int, order: str | None = None) -> np.ndarray:
    """``np.asarray(PIL.Image.fromarray(grey).resize((width, height), LANCZOS))`` as float64, bit-identical.

    Pillow's two passes (each rounded to 8 bit, ``Resample.c``) as matrix products; which pass runs first
    follows :func:`vertical_first`. Every product and partial sum is an integer of magnitude < 2**53, so
    float64 BLAS is exact.

    Args:
        grey: ``(H, W)`` ``uint8`` (or float64 of integers in ``[0, 255]``).
        width, height: output size in pixels.
        order: pass order (``"pillow13"`` or ``"horizontal-first"``); None = the one
            :func:`fast_resize_matches_pillow` found.

    Returns:
        ``(height, width)`` float64 of integers in ``[0, 255]``.
    """
    g = np.asarray(grey, dtype=np.float64)
    h, w = g.shape
    if vertical_first(h, w, height, width, order):
        t = vertical_pass(g, height) if h != height else g
        return _horizontal_pass(t, width) if w != width else t
    t = _horizontal_pass(g, width) if w != width else g
    return vertical_pass(t, height) if h != height else t


def lanczos_hash_inputs(grey: np.ndarray, g: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The pHash (32x32) and dHash (9 wide x 8 high) LANCZOS inputs of one grey image, bit-identical to PIL.

    Args:
        grey: ``(H, W)`` ``uint8`` grey image.
        g: optional float64 copy of ``grey`` (e.g. :func:`float_buffer`'s) to read instead of converting again.

    Returns:
        ``(32, 32)`` and ``(8, 9)`` float64 arrays of integers in ``[0, 255]``. Uses :func:`pillow_lanczos`
        when :func:`fast_resize_matches_pillow` holds, else ``PIL.Image.resize`` itself. Below 256 px a side,
        when both sizes take the same pass order, the two resizes share their products
        (:func:`_joint_lanczos`).
    """
    if not fast_resize_matches_pillow():
        im = Image.fromarray(np.ascontiguousarray(grey, dtype=np.uint8))
        return (np.asarray(im.resize((PHASH_SIDE, PHASH_SIDE), _LANCZOS), np.float64),
                np.asarray(im.resize(DHASH_SIZE, _LANCZOS), np.float64))
    h, w = grey.shape
    g = float_buffer(grey) if g is None else g
    if max(h, w) < _BANDED_FROM and (vertical_first(h, w, PHASH_SIDE, PHASH_SIDE)
                                     == vertical_first(h, w, DHASH_SIZE[1], DHASH_SIZE[0])):
        return _joint_lanczos(g)
    return pillow_lanczos(g, PHASH_SIDE, PHASH_SIDE), pillow_lanczos(g, *DHASH_SIZE)


_BUFFERS = threading.local()


def float_buffer(grey: np.ndarray) -> np.ndarray:
    """``grey`` (``(H, W)``, any real dtype) copied into this thread's reusable float64 buffer, as an ``(H, W)``
    view valid until the thread's next call: a fresh multi-megabyte array per image would be ``mmap``-ed and
    page-faulted anew in every worker thread, and the resizes that follow read it while it is still in cache."""
    size = grey.size
    buf = getattr(_BUFFERS, "buf", None)
    if buf is None or buf.size < size:
        buf = _BUFFERS.buf = np.empty(max(size, 1 << 16))
    out = buf[:size].reshape(grey.shape)
    np.copyto(out, grey)
    return out


@lru_cache(maxsize=256)
def _joint_matrices(h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """``[K_32 | K_9]`` horizontal ``(w, 41)`` and ``[K_32 | K_8]`` vertical ``(h, 40)`` LANCZOS matrices."""
    kh = np.hstack([lanczos_matrix(w, PHASH_SIDE), lanczos_matrix(w, DHASH_SIZE[0])])
    kv = np.hstack([lanczos_matrix(h, PHASH_SIDE), lanczos_matrix(h, DHASH_SIZE[1])])
    kh.flags.writeable = False
    kv.flags.writeable = False
    return kh, np.ascontiguousarray(kv.T)


def _joint_lanczos(g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both LANCZOS inputs of a float64 ``(H, W)`` image in two products, when both sizes take the same pass
    order: the first pass to ``32 + 9`` (or ``32 + 8``) samples at once, rounded; the second pass of the whole
    intermediate, rounded, of which the two wanted blocks are kept. Each kept value is the same integer sum as in
    :func:`pillow_lanczos` (exact in float64), so the result is bit-identical to it."""
    h, w = g.shape
    kh, kvt = _joint_matrices(h, w)
    if vertical_first(h, w, PHASH_SIDE, PHASH_SIDE):
        both = round_clip(round_clip(kvt @ g) @ kh)  # (40, 41)
    else:
        both = round_clip(kvt @ round_clip(g @ kh))
    return both[:PHASH_SIDE, :PHASH_SIDE].copy(), both[PHASH_SIDE:, PHASH_SIDE:].copy()


_ORDER = "pillow13"
_PROBE_LOCK = threading.Lock()
_PROBE_SHAPES = ((1, 1), (3, 2), (8, 9), (31, 33), (40, 12), (12, 40), (97, 60), (60, 97), (300, 120), (120, 300),
                 (288, 384))


@lru_cache(maxsize=1)
def fast_resize_matches_pillow() -> bool:
    """Whether :func:`pillow_lanczos` equals the installed Pillow's LANCZOS resize on probe images.

    Probes: ``np.sin`` equal to ``math.sin`` (the C library's, which Pillow calls) on 20,000 points of the
    filter's range; random ``uint8`` images of 11 shapes (tall, wide, tiny, both pass orders) resized to 32x32
    and 9x8.
    Tries Pillow 13's pass order, then horizontal-first (older Pillow); keeps the first that matches all
    probes. False (hashing then calls ``PIL.Image.resize``: same values, slower) when neither does.
    """
    global _ORDER
    rng = np.random.default_rng(20261203)
    grid = rng.uniform(-3.0 * math.pi, 3.0 * math.pi, 20_000)
    if not np.array_equal(np.sin(grid), np.array([math.sin(v) for v in grid.tolist()])):
        return False  # NumPy's sin is not the C library's here: the weights could differ in the last bit
    probes = [rng.integers(0, 256, s, dtype=np.uint8) for s in _PROBE_SHAPES]
    with _PROBE_LOCK:  # one probe at a time; _ORDER is set only once an order has matched
        for order in ("pillow13", "horizontal-first"):
            if all(np.array_equal(pillow_lanczos(p, ow, oh, order),
                                  np.asarray(Image.fromarray(p).resize((ow, oh), _LANCZOS)))
                   for p in probes for ow, oh in ((PHASH_SIDE, PHASH_SIDE), DHASH_SIZE)):
                _ORDER = order
                return True
    return False


__all__ = ["lanczos_matrix", "pillow_lanczos", "lanczos_hash_inputs", "fast_resize_matches_pillow", "float_buffer",
           "band_blocks", "lanczos_bands", "round_clip", "vertical_first",
           "vertical_pass", "PHASH_SIDE", "DHASH_SIZE"]
