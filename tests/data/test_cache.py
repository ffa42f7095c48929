"""Preprocessing cache: decode once per setting, new key on a changed setting or file, no partial entry."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import msb.data.cache as cache_mod
from msb.data.cache import build_cache, cache_key
from msb.data.schema import load_prepared_dataset, mask_to_onehot, read_image, read_mask
from msb.data.synth import make_synthetic_dataset
from msb.errors import MSBError


@pytest.fixture
def ds(tmp_path: Path):
    make_synthetic_dataset(tmp_path / "d", n_samples=6, size=(40, 48), seed=1)
    return load_prepared_dataset(tmp_path / "d")


def test_decodes_once_and_matches_direct_resize(ds, tmp_path, monkeypatch):
    calls = {"n": 0}
    real = cache_mod.read_image

    def counting(path):
        calls["n"] += 1
        return real(path)

    monkeypatch.setattr(cache_mod, "read_image", counting)
    c1 = build_cache(ds, (32, 32), tmp_path / "c")
    assert calls["n"] == 6
    c2 = build_cache(ds, (32, 32), tmp_path / "c")
    assert calls["n"] == 6 and c2.path == c1.path          # second call: no decoding
    build_cache(ds, (64, 64), tmp_path / "c")
    assert calls["n"] == 12                                 # another setting: another entry
    assert c1.images.shape == (6, 32, 32, 3) and c1.masks.shape == (6, 1, 32, 32)
    sid = c1.sample_ids[2]
    import cv2
    img = read_image(ds.image_path(sid))
    expected = cv2.resize(img, (32, 32), interpolation=cv2.INTER_AREA)
    assert np.array_equal(c1.images[2], expected)
    raw = cv2.resize(read_mask(ds.mask_path(sid)), (32, 32), interpolation=cv2.INTER_NEAREST)
    assert np.array_equal(c1.masks[2], mask_to_onehot(raw, ds.classes, ds.mask_path(sid)).astype(np.uint8))


def test_key_changes_with_file(ds, tmp_path):
    k1 = cache_key(ds, (32, 32))
    p = ds.image_path(ds.index["sample_id"].iloc[0])
    p.write_bytes(p.read_bytes())  # same bytes, new mtime
    import os
    st = os.stat(p)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert cache_key(ds, (32, 32)) != k1


def test_bad_mask_value_leaves_no_entry(ds, tmp_path):
    import cv2
    sid = ds.index["sample_id"].iloc[3]
    m = read_mask(ds.mask_path(sid)).astype(np.uint8).copy()
    m[0, 0] = 77
    cv2.imwrite(str(ds.mask_path(sid)), m)
    with pytest.raises(MSBError) as e:
        build_cache(ds, (40, 48), tmp_path / "c")
    assert ds.mask_path(sid).name in str(e.value) and "77" in str(e.value)
    assert list((tmp_path / "c").iterdir()) == []
