"""Packed hashes, vectorised Hamming search, exact groups and connected components vs independent references."""

from __future__ import annotations

from itertools import combinations
from pathlib import Path

import imagehash
import numpy as np
import pytest
from PIL import Image

from msb.audit import search
from msb.audit.hashing import fingerprint, hash_images, hex64, pack_hash
from msb.audit.search import component_labels, exact_labels, hamming, naive_pairs, pairs_within, popcount64
from msb.errors import MSBError


def python_pairs(hashes: list[int], k: int) -> set[tuple[int, int, int]]:
    """Reference: plain Python loop with int.bit_count (independent of numpy)."""
    return {(a, b, bin(hashes[a] ^ hashes[b]).count("1")) for a, b in combinations(range(len(hashes)), 2)
            if bin(hashes[a] ^ hashes[b]).count("1") <= k}


def planted_hashes(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    h = rng.integers(0, 2**63, n, dtype=np.uint64) * np.uint64(2) + rng.integers(0, 2, n, dtype=np.uint64)
    for t in range(0, n - 1, 7):  # near copies: flip t % 5 bits of an earlier hash
        flips = rng.choice(64, size=t % 5, replace=False)
        v = int(h[t])
        for f in flips:
            v ^= 1 << int(f)
        h[t + 1] = np.uint64(v)
    h[n - 1] = h[0]  # an exact copy far away in the order
    return h


@pytest.mark.parametrize("block,workers,backend", [(1, 1, "numpy"), (7, 1, "numpy"), (64, 2, "numpy"),
                                                   (1000, 1, "numpy"), (256, 1, "faiss"), (256, 2, "faiss")])
def test_pairs_within_matches_python_loop(block: int, workers: int, backend: str) -> None:
    if backend == "faiss" and not search.HAS_FAISS:
        pytest.skip("faiss-cpu not installed: the faiss backend is not tested")
    h = planted_hashes(300, 0)
    ref = python_pairs([int(v) for v in h], 6)
    i, j, d = pairs_within(h, 6, block=block, workers=workers, backend=backend)
    assert set(zip(i.tolist(), j.tolist(), d.tolist())) == ref
    assert len(i) == len(ref) >= 40  # planted ones found (random pairs at <= 6 bits are ~1e-11 likely)
    assert np.all(i < j) and list(zip(i, j)) == sorted(zip(i, j))


def test_popcount_and_lookup_table_fallback(monkeypatch) -> None:
    vals = np.array([0, 1, 2**64 - 1, 0x8000000000000000, 0x0F0F0F0F0F0F0F0F, 12345678901234567890], np.uint64)
    expected = [bin(int(v)).count("1") for v in vals]
    assert popcount64(vals).tolist() == expected == [0, 1, 64, 1, 32, bin(12345678901234567890).count("1")]
    monkeypatch.setattr(search, "HAS_BITWISE_COUNT", False)
    assert search.popcount64(vals).tolist() == expected
    h = planted_hashes(120, 3)
    i, j, d = search.pairs_within(h, 4, block=16, backend="numpy")
    assert set(zip(i.tolist(), j.tolist(), d.tolist())) == python_pairs([int(v) for v in h], 4)
    assert hamming(np.uint64(0b1011), np.uint64(0b0110)) == 3


@pytest.mark.parametrize("backend", ["numpy", "auto"])
def test_pairs_within_edge_cases(backend: str) -> None:
    assert [len(x) for x in pairs_within(np.zeros(0, np.uint64), 3, backend=backend)] == [0, 0, 0]
    assert [len(x) for x in pairs_within(np.array([5], np.uint64), 3, backend=backend)] == [0, 0, 0]
    i, j, d = pairs_within(np.array([7, 7, 7], np.uint64), 0, backend=backend)
    assert list(zip(i, j, d)) == [(0, 1, 0), (0, 2, 0), (1, 2, 0)]
    # distance exactly k is in, k + 1 out (faiss range search is strict: radius k + 1)
    i, j, d = pairs_within(np.array([0, 0xFF, 0x1FF], np.uint64), 8, backend=backend)
    assert list(zip(i.tolist(), j.tolist(), d.tolist())) == [(0, 1, 8), (1, 2, 1)]
    with pytest.raises(ValueError):
        pairs_within(np.array([1, 2], np.uint64), 65)
    with pytest.raises(ValueError):
        pairs_within(np.array([1, 2], np.uint64), 3, backend="annoy")


def test_naive_imagehash_loop_agrees(tmp_path: Path, helpers) -> None:
    """The vectorised search and imagehash's own ``h1 - h2`` loop find the same pairs on real hashes."""
    paths = []
    for s in range(10):
        p = tmp_path / f"{s}.png"
        helpers.write_rgb(p, helpers.smooth_image(s % 6))  # 4 duplicated images
        paths.append(p)
    objs = [imagehash.phash(Image.open(p)) for p in paths]
    table = hash_images(paths)
    assert hex64(table.phash) == [str(o) for o in objs]
    i, j, d = pairs_within(table.phash, 10)
    assert list(zip(i.tolist(), j.tolist(), d.tolist())) == naive_pairs(objs, 10)
    assert len(i) == 4


def test_pack_hash_equals_imagehash_hex(tmp_path: Path, helpers) -> None:
    p = tmp_path / "x.png"
    helpers.write_rgb(p, helpers.smooth_image(11))
    h = imagehash.dhash(Image.open(p))
    assert f"{pack_hash(h):016x}" == str(h)
    fp = fingerprint(p, thumb_size=16)
    assert fp.thumb.shape == (16, 16) and fp.thumb.dtype == np.uint8
    assert (fp.height, fp.width) == (96, 128) and fp.n_bytes == p.stat().st_size
    import hashlib

    assert fp.sha256 == hashlib.sha256(p.read_bytes()).hexdigest()


def test_hash_images_reports_unreadable_files(tmp_path: Path, helpers) -> None:
    good = tmp_path / "good.png"
    helpers.write_rgb(good, helpers.smooth_image(1))
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not an image")
    with pytest.raises(MSBError, match=r"1 image\(s\) could not be fingerprinted: .*bad.png: cannot decode image"):
        hash_images([good, bad])
    with pytest.raises(MSBError, match=r"missing.png: cannot read image file"):
        hash_images([tmp_path / "missing.png"])


def test_hash_images_two_processes_same_result(tmp_path: Path, helpers) -> None:
    paths = []
    for s in range(6):
        p = tmp_path / f"{s}.png"
        helpers.write_rgb(p, helpers.smooth_image(s))
        paths.append(p)
    a, b = hash_images(paths), hash_images(paths, workers=2)
    assert np.array_equal(a.phash, b.phash) and np.array_equal(a.dhash, b.dhash)
    assert np.array_equal(a.thumbs, b.thumbs) and list(a.sha256) == list(b.sha256)


def test_exact_and_component_labels() -> None:
    assert exact_labels(np.array(["x", "y", "x", "z"])).tolist() == [0, 1, 0, 2]
    # edges 0-3, 3-5, 1-2 over 7 nodes -> {0,3,5}, {1,2}, {4}, {6}; numbered by smallest node
    lab = component_labels(7, np.array([0, 3, 1]), np.array([3, 5, 2]))
    assert lab.tolist() == [0, 1, 1, 0, 2, 0, 3]
    assert component_labels(3, np.zeros(0, np.int64), np.zeros(0, np.int64)).tolist() == [0, 1, 2]


@pytest.mark.parametrize("m,k", [(3, 8), (4, 8), (4, 3), (9, 8), (3, 0), (8, 16)])
def test_multi_index_hashing_equals_the_exhaustive_search(m: int, k: int) -> None:
    """MIH (msb.audit.mih) on random + planted hashes (near copies, an exact copy, a bucket of 40 equal
    substrings, pairs at exactly k and k + 1 bits) gives the NumPy exhaustive result, pair for pair."""
    from msb.audit.mih import pairs_mih

    rng = np.random.default_rng(k * 10 + m)
    h = planted_hashes(3000, m)
    h[100:140] = (h[100:140] & np.uint64(0xFFFFFFFFFFE00000)) | np.uint64(12345)  # one crowded low substring
    kk = min(k, 63)
    h[200] = np.uint64(0)
    h[201] = np.uint64((1 << kk) - 1)  # distance kk
    h[202] = np.uint64((1 << (kk + 1)) - 1) << np.uint64(1) if kk < 63 else np.uint64(2**64 - 1)
    h[300:310] = rng.integers(0, 2**63, 10, dtype=np.uint64)
    ref = pairs_within(h, k, block=512, backend="numpy")
    assert len(ref[0]) >= (250 if k >= 3 else 60)  # the planted pairs (random pairs this close: ~1e-9)
    for workers in (1, 2):  # two threads share the masks: the same pairs
        got = pairs_mih(h, k, m=m, workers=workers)
        for a, b in zip(got, ref):
            assert a.dtype == b.dtype and np.array_equal(a, b)
    assert [len(x) for x in pairs_mih(h[:1], k, m=m)] == [0, 0, 0]


def test_multi_index_hashing_with_a_bucket_of_more_than_255_hashes() -> None:
    """A substring value shared by 300 hashes (the probes' narrow count table is then int32, not uint8): the
    exhaustive search's pairs, with one and two threads."""
    from msb.audit.mih import pairs_mih

    rng = np.random.default_rng(7)
    h = rng.integers(0, 2**63, 2000, dtype=np.uint64)
    h[:300] = (h[:300] & np.uint64(0xFFFFFFFFFFE00000)) | np.uint64(777)  # 300 equal low 21-bit substrings
    h[300:320] = h[0] ^ (np.uint64(1) << rng.integers(21, 64, 20).astype(np.uint64))  # 1 bit from h[0]
    ref = pairs_within(h, 8, block=512, backend="numpy")
    assert len(ref[0]) >= 20
    for workers in (1, 2):
        for a, b in zip(pairs_mih(h, 8, m=3, workers=workers), ref):
            assert np.array_equal(a, b)


def test_auto_uses_mih_only_for_large_sets(monkeypatch) -> None:
    assert not search._mih_pays(10_000, 8)  # below MIH_MIN: the flat search
    assert search._mih_pays(50_000, 8)
    assert search._mih_pays(1_000_000, 8) and not search._mih_pays(1_000_000, 40)  # k = 40: masks explode
    monkeypatch.setattr(search, "MIH_MIN", 100)
    h = planted_hashes(2000, 5)
    assert all(np.array_equal(a, b) for a, b in zip(pairs_within(h, 6), pairs_within(h, 6, backend="numpy")))
    assert all(np.array_equal(a, b) for a, b in zip(pairs_within(h, 6, backend="mih"), pairs_within(h, 6)))
    from msb.audit.mih import pairs_mih

    with pytest.raises(ValueError):
        pairs_mih(h, 6, m=2)  # 32-bit substrings: a bucket table of 2**32 entries is refused
