"""The batched, threaded fingerprinting (msb.audit.hashing) is bit-identical to imagehash and to Pillow.

References are independent of our code: ``imagehash.phash`` / ``imagehash.dhash`` called on the same files, and
``PIL.Image.resize(..., LANCZOS)`` for the fixed-point resize we re-implement as matrix products.
"""

from __future__ import annotations

from pathlib import Path

import imagehash
import numpy as np
import pytest
from PIL import Image

from msb.audit.hashing import fast_resize_matches_pillow, fingerprint, hash_images, hex64, lanczos_hash_inputs


def _imagehash_pair(path: Path) -> tuple[str, str]:
    with Image.open(path) as im:
        return str(imagehash.phash(im)), str(imagehash.dhash(im))


def _edge_images(folder: Path) -> list[Path]:
    """Tiny, flat grey, RGBA, palette, 16-bit, 1-bit, exact-size (32x32, 9x8) and very wide/tall images."""
    rng = np.random.default_rng(3)
    out = []

    def save(name: str, im: Image.Image) -> None:
        p = folder / name
        im.save(p)
        out.append(p)

    save("tiny_1x1.png", Image.fromarray(np.array([[200]], np.uint8)))
    save("tiny_3x2_rgb.png", Image.fromarray(rng.integers(0, 256, (2, 3, 3), dtype=np.uint8)))
    save("grey_flat.png", Image.fromarray(np.full((50, 70), 128, np.uint8)))
    save("black.png", Image.fromarray(np.zeros((40, 40), np.uint8)))
    save("white_rgb.png", Image.fromarray(np.full((33, 31, 3), 255, np.uint8)))
    rgba = rng.integers(0, 256, (60, 80, 4), dtype=np.uint8)
    rgba[..., 3] = np.where(np.arange(80) < 40, 0, 255)[None]  # half transparent
    save("rgba.png", Image.fromarray(rgba, "RGBA"))
    save("palette.png", Image.fromarray(rng.integers(0, 256, (45, 61, 3), dtype=np.uint8)).convert("P"))
    save("grey16.png", Image.fromarray(rng.integers(0, 65535, (37, 53), dtype=np.uint16)))
    save("binary.png", Image.fromarray(rng.integers(0, 2, (30, 30), dtype=np.uint8) * 255).convert("1"))
    save("exact_32.png", Image.fromarray(rng.integers(0, 256, (32, 32), dtype=np.uint8)))
    save("exact_9x8.png", Image.fromarray(rng.integers(0, 256, (8, 9), dtype=np.uint8)))
    save("wide.png", Image.fromarray(rng.integers(0, 256, (5, 700), dtype=np.uint8)))
    save("tall_rgb.jpg", Image.fromarray(rng.integers(0, 256, (600, 12, 3), dtype=np.uint8)))
    return out


def test_lanczos_matrices_equal_pillow_resize() -> None:
    """Our fixed-point LANCZOS products equal Pillow's resize on random images of many shapes (upscaling, tall
    images where Pillow runs the vertical pass first, the banded path from 256 px and clipped overshoot)."""
    assert fast_resize_matches_pillow()  # the fast path (not the PIL fallback) is what this test checks
    rng = np.random.default_rng(0)
    shapes = [(1, 1), (2, 5), (8, 9), (32, 32), (31, 33), (40, 12), (600, 12), (300, 40), (120, 160), (97, 300),
              (288, 384), (1072, 1351), (1351, 700), (200, 60), (60, 200), (255, 255), (100, 33), (33, 100),
              (120, 255), (250, 9), (50, 40)]  # below 256 px a side both sizes share their products (_joint_lanczos)
    for h, w in shapes:
        g = rng.integers(0, 256, (h, w), dtype=np.uint8)
        g[: h // 2, : w // 3] = 255 * (rng.random((h // 2, w // 3)) > 0.5)  # hard edges: overshoot clipped
        p, d = lanczos_hash_inputs(g)
        im = Image.fromarray(g)
        assert np.array_equal(p, np.asarray(im.resize((32, 32), Image.Resampling.LANCZOS))), (h, w)
        assert np.array_equal(d, np.asarray(im.resize((9, 8), Image.Resampling.LANCZOS))), (h, w)


def test_edge_cases_bit_identical_to_imagehash(tmp_path: Path) -> None:
    paths = _edge_images(tmp_path)
    ref = [_imagehash_pair(p) for p in paths]
    for workers in (1, 2):
        table = hash_images(paths, workers=workers)
        assert list(zip(hex64(table.phash), hex64(table.dhash))) == ref
    fp = fingerprint(paths[2])  # flat grey: DCT AC terms are round-off, their signs must match imagehash's
    assert (f"{fp.phash:016x}", f"{fp.dhash:016x}") == ref[2]
    assert fp.dhash == 0 and (fp.height, fp.width) == (50, 70)


def test_real_images_bit_identical_to_imagehash(shared_dir: Path) -> None:
    """Every 50th image of the shared datasets (JPEG and PNG, 5 datasets, many sizes), 1 and 2 threads."""
    files = sorted(p for p in (shared_dir / "data").glob("*/images/*") if p.suffix.lower() in
                   {".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff"})
    if not files:
        pytest.skip(f"no images under {shared_dir / 'data'}")
    files = files[::50]
    assert len(files) >= 25 and len({p.parent.parent.name for p in files}) >= 3
    ref = [_imagehash_pair(p) for p in files]
    one, two = hash_images(files), hash_images(files, workers=2)
    assert list(zip(hex64(one.phash), hex64(one.dhash))) == ref
    assert np.array_equal(one.phash, two.phash) and np.array_equal(one.dhash, two.dhash)
    assert np.array_equal(one.thumbs, two.thumbs) and list(one.sha256) == list(two.sha256)


def test_worker_processes_bit_identical_to_imagehash(shared_dir: Path, tmp_path: Path, monkeypatch) -> None:
    """The process path (from PROCESS_FROM images; lowered here, with chunks of 4 so that several tasks and a
    short last one run; forked, then spawned): the same hashes as imagehash, the same thumbnails and digests as one thread, and an
    unreadable file named as on the thread path."""
    import msb.audit.hashing as hashing
    from msb.errors import MSBError

    files = sorted(p for p in (shared_dir / "data").glob("*/images/*") if p.suffix.lower() in {".jpg", ".png"})
    if not files:
        pytest.skip(f"no images under {shared_dir / 'data'}")
    files = files[::97][:14]
    monkeypatch.setattr(hashing, "PROCESS_FROM", 2)
    monkeypatch.setattr(hashing, "PROCESS_FROM_SPAWN", 2)
    monkeypatch.setattr(hashing, "_CHUNK", 4)
    ref = [_imagehash_pair(p) for p in files]
    procs = hash_images(files, workers=2)
    assert list(zip(hex64(procs.phash), hex64(procs.dhash))) == ref
    monkeypatch.setattr(hashing, "_start_method", lambda: "spawn")  # what a process with other threads gets
    spawned = hash_images(files[:6], workers=2)
    assert list(zip(hex64(spawned.phash), hex64(spawned.dhash))) == ref[:6]
    one = hash_images(files)  # workers=1: this thread
    assert np.array_equal(one.thumbs, procs.thumbs) and list(one.sha256) == list(procs.sha256)
    assert np.array_equal(one.height, procs.height) and np.array_equal(one.n_bytes, procs.n_bytes)
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"not an image")
    with pytest.raises(MSBError, match=r"1 image\(s\) could not be fingerprinted: .*broken\.jpg"):
        hash_images([*files[:5], bad], workers=2)


def test_empty_list_and_bad_workers() -> None:
    t = hash_images([])
    assert len(t) == 0 and t.thumbs.shape == (0, 64, 64) and t.phash.dtype == np.uint64
    from msb.errors import MSBError

    with pytest.raises(MSBError, match="workers must be an integer >= 1"):
        hash_images([], workers=0)


def _pillow_coeffs_loop(n_in: int, n_out: int) -> np.ndarray:
    """Plain-Python transcription of Pillow's precompute_coeffs + normalize_coeffs_8bpc (Resample.c), LANCZOS."""
    import math

    def lanczos(x: float) -> float:
        if not -3.0 <= x < 3.0:
            return 0.0
        def sinc(v: float) -> float:
            return 1.0 if v == 0.0 else math.sin(v * math.pi) / (v * math.pi)
        return sinc(x) * sinc(x / 3)

    m = np.zeros((n_in, n_out))
    scale = float(n_in) / n_out
    fs = max(scale, 1.0)
    support = 3.0 * fs
    for xx in range(n_out):
        center = (xx + 0.5) * scale
        xmin = max(int(center - support + 0.5), 0)
        n = min(int(center + support + 0.5), n_in) - xmin
        w = [lanczos((x + xmin - center + 0.5) * (1.0 / fs)) for x in range(n)]
        ww = 0.0
        for v in w:
            ww += v
        w = [v / ww for v in w] if ww != 0.0 else w
        m[xmin:xmin + n, xx] = [float(int(v * (1 << 22) + (-0.5 if v < 0 else 0.5))) for v in w]
    return m


def test_vectorised_weights_equal_the_loop_transcription() -> None:
    from msb.audit.hashing import lanczos_matrix

    for n_in in (1, 2, 5, 8, 9, 31, 33, 97, 288, 384, 575, 1351, 1920):
        for n_out in (8, 9, 32):
            if n_in != n_out:
                assert np.array_equal(lanczos_matrix(n_in, n_out), _pillow_coeffs_loop(n_in, n_out)), (n_in, n_out)
