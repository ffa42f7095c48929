"""Labelled fractions as a split policy (``msb.data.labelled``) and the images-only unlabelled loader."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch.utils.data import DataLoader

from msb.config.generate import GeneratedRun, config_hash
from msb.config.schema import RunConfig
from msb.data.cache import build_cache
from msb.data.classes import ClassSpec
from msb.data.labelled import (LABELLED_FILE, draw_labelled, ensure_labelled, explicit_labelled,
                               read_labelled_ids)
from msb.data.schema import load_prepared_dataset, write_prepared_dataset
from msb.data.synth import make_synthetic_dataset
from msb.data.torch_dataset import UnlabelledImageDataset, labelled_datasets
from msb.errors import MSBError


def _pool(n: int = 120, n_empty: int = 36, group_size: int = 1):
    ids = [f"s{i:03d}" for i in range(n)]
    non_empty = [i >= n_empty for i in range(n)]
    groups = [f"g{i // group_size}" for i in range(n)] if group_size > 1 else None
    return ids, non_empty, groups


def test_labelled_disjoint_from_unlabelled_and_stable_per_seed():
    ids, non_empty, groups = _pool(group_size=3)
    a = draw_labelled(ids, non_empty, 0.3, seed=7, groups=groups)
    b = draw_labelled(list(reversed(ids)), list(reversed(non_empty)), 0.3, seed=7, groups=list(reversed(groups)))
    c = draw_labelled(ids, non_empty, 0.3, seed=8, groups=groups)
    lab, unl = set(a.index[a]), set(a.index[~a])
    assert lab.isdisjoint(unl) and lab | unl == set(ids)
    assert a.equals(b)  # same seed: same subset, whatever the row order
    assert set(c.index[c]) != lab  # another seed draws another subset
    assert len(lab) == 36  # 12 empty + 24 non-empty: see test_groups_never_split_and_strata_close


def test_strata_proportions_exact_without_groups():
    """120 samples, 36 with empty masks: 10 % -> round(3.6) = 4 empty + round(8.4) = 8 non-empty; 30 % ->
    round(10.8) = 11 empty + round(25.2) = 25 non-empty (hand-computed targets, met exactly without groups)."""
    ids, non_empty, _ = _pool()
    flags = pd.Series(non_empty, index=ids)
    for fraction, (e, ne) in ((0.1, (4, 8)), (0.3, (11, 25))):
        for seed in range(5):
            lab = draw_labelled(ids, non_empty, fraction, seed)
            chosen = flags[lab[lab].index]
            assert (int((~chosen).sum()), int(chosen.sum())) == (e, ne)


def test_groups_never_split_and_strata_close():
    """Groups of 3 (one stratum per group here): every group on one side; each stratum's labelled count is the
    multiple of 3 closest to its target: empty 36 -> round(10.8) = 11 -> 12 (9 is 2 off); non-empty 84 ->
    round(25.2) = 25 -> 24 (27 is 2 off)."""
    ids, non_empty, groups = _pool(group_size=3)
    flags = pd.Series(non_empty, index=ids)
    for seed in range(6):
        lab = draw_labelled(ids, non_empty, 0.3, seed, groups)
        by_group = pd.Series(lab.reindex(ids).to_numpy(), index=groups).groupby(level=0).nunique()
        assert (by_group == 1).all()
        chosen = flags[lab[lab].index]
        assert (int((~chosen).sum()), int(chosen.sum())) == (12, 24)


def test_mixed_group_counts_as_non_empty_and_stays_whole():
    ids = ["a1", "a2", "b1", "c1", "d1"]
    non_empty = [False, True, False, True, True]  # group a mixes an empty and a non-empty frame
    groups = ["a", "a", "", "", ""]
    for seed in range(10):
        lab = draw_labelled(ids, non_empty, 0.5, seed, groups)
        assert lab["a1"] == lab["a2"]
        # empty stratum = {b1}: round(0.5) = 0 -> never labelled; non-empty {a (2 frames), c1, d1}: target 2,
        # met by group a alone or by c1 + d1; c1 then a gives cut 1 or 3 (tie -> fewer: 1)
        assert not lab["b1"] and int(lab[["a1", "a2", "c1", "d1"]].sum()) in (1, 2)


def test_refusals():
    ids, non_empty, groups = _pool(n=10, n_empty=0)
    with pytest.raises(MSBError, match="labels no image"):
        draw_labelled(ids, non_empty, 0.01, 0)
    with pytest.raises(MSBError, match=r"\(0, 1\]"):
        draw_labelled(ids, non_empty, 0.0, 0)
    with pytest.raises(MSBError, match="not in this run's training split: nope"):
        explicit_labelled(ids, ["s001", "nope"])
    with pytest.raises(MSBError, match="group\\(s\\) g0 have labelled and unlabelled"):
        explicit_labelled(["x", "y", "z"], ["x"], groups=["g0", "g0", ""])
    with pytest.raises(MSBError, match="exactly one"):
        ensure_labelled("/nonexistent-run", ids, non_empty, 0)


def test_explicit_ids_file_and_resume(tmp_path: Path):
    ids, non_empty, _ = _pool(n=20, n_empty=5)
    (tmp_path / "ids.csv").write_text("sample_id\ns003\ns010\n")
    assert read_labelled_ids(tmp_path / "ids.csv") == ["s003", "s010"]
    run = tmp_path / "run"
    run.mkdir()
    lab = ensure_labelled(run, ids, non_empty, 0, labelled_ids=str(tmp_path / "ids.csv"))
    assert sorted(lab.index[lab]) == ["s003", "s010"]
    text = (run / LABELLED_FILE).read_text()
    assert text.splitlines()[0] == "sample_id,labelled" and "s003,1" in text and "s004,0" in text
    assert len(text.splitlines()) == 21
    # a run's labelled.csv is accepted as a labelled-ids file (re-use a published subset)
    assert read_labelled_ids(run / LABELLED_FILE) == ["s003", "s010"]
    # resume: the file wins, whatever the policy now says
    again = ensure_labelled(run, ids, non_empty, 99, fraction=0.5)
    assert again.equals(lab)
    with pytest.raises(MSBError, match="does not list exactly"):
        ensure_labelled(run, ids[:-1], non_empty[:-1], 0, fraction=0.5)


def test_config_keys_hash_neutral_and_exclusive():
    base = {"data": {"name": "d", "root": "r"}, "model": {"arch": "unet"}}
    plain = RunConfig.model_validate(base)
    dumped = plain.model_dump(mode="json")["data"]
    assert not any(k.startswith("labelled") for k in dumped)
    frac = RunConfig.model_validate({**base, "data": {**base["data"], "labelled_fraction": 0.1}})
    assert config_hash(frac) != config_hash(plain) and frac.data.labelled_policy
    with pytest.raises(ValueError, match="not both"):
        RunConfig.model_validate({**base, "data": {**base["data"], "labelled_fraction": 0.1,
                                                   "labelled_ids": ["a"]}})
    listed = RunConfig.model_validate({**base, "data": {**base["data"], "labelled_ids": ["a", "b"]}})
    assert listed.data.labelled_ids == ["a", "b"]


SENTINEL = 77


@pytest.fixture()
def tiny_dataset(tmp_path: Path):
    """8 images 16x16: image i has value 10 i everywhere; mask i has a 4x4 square (i even) or is empty."""
    import cv2

    root = tmp_path / "tiny"
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    rows = []
    for i in range(8):
        img = np.full((16, 16, 3), 10 * i, np.uint8)
        mask = np.zeros((16, 16), np.uint8)
        if i % 2 == 0:
            mask[4:8, 4:8] = 255
        cv2.imwrite(str(root / "images" / f"s{i}.png"), img)
        cv2.imwrite(str(root / "masks" / f"s{i}.png"), mask)
        rows.append({"sample_id": f"s{i}", "image_path": f"images/s{i}.png", "mask_path": f"masks/s{i}.png",
                     "split": "train", "group": "", "height": 16, "width": 16, "source": "test"})
    write_prepared_dataset(root, pd.DataFrame(rows), [ClassSpec(0, "background", (0,)),
                                                       ClassSpec(1, "lesion", (255,))])
    return load_prepared_dataset(root)


def test_unlabelled_masks_never_reach_a_batch(tiny_dataset, tmp_path: Path):
    """The cached masks of the unlabelled rows are overwritten on disk with a sentinel value; iterating both
    loaders (with augmentation) never yields it, the unlabelled batches have no mask key at all, and their
    images are the cached images (normalised)."""
    cache = build_cache(tiny_dataset, (16, 16), tmp_path / "cache")
    ids = [f"s{i}" for i in range(8)]
    labelled = draw_labelled(ids, [i % 2 == 0 for i in range(8)], 0.5, seed=1)
    unl_ids = list(labelled.index[~labelled])
    masks = np.load(cache.path / "masks.npy", mmap_mode="r+")
    for s in unl_ids:
        masks[cache.row_of[s]] = SENTINEL
    masks.flush()
    del masks
    cache = build_cache(tiny_dataset, (16, 16), tmp_path / "cache")  # re-opened from disk
    assert int(np.asarray(cache.masks).max()) == SENTINEL
    mean, std = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
    from msb.data.torch_dataset import build_augmentation

    lab_ds, unl_ds = labelled_datasets(cache, labelled, mean, std, build_augmentation(0.5, 0.5, seed=0))
    assert set(lab_ds.sample_ids).isdisjoint(unl_ds.sample_ids)
    assert set(lab_ds.sample_ids) | set(unl_ds.sample_ids) == set(ids)
    assert not any(v is cache.masks for v in vars(unl_ds).values())
    for x, y, idx in DataLoader(lab_ds, batch_size=3):
        assert set(torch.unique(y).tolist()) <= {0.0, 1.0}
        for k, i in enumerate(idx.tolist()):
            sid = lab_ds.sample_ids[i]
            assert sid not in unl_ids
            assert int(y[k].sum()) == (16 if int(sid[1:]) % 2 == 0 else 0)
    seen = []
    for batch in DataLoader(unl_ds, batch_size=3):
        assert set(batch) == {"image", "index"}
        for k, i in enumerate(batch["index"].tolist()):
            sid = unl_ds.sample_ids[i]
            seen.append(sid)
            # normalised with mean 0, std 1: x = (v - 0) / (1 * 255)
            assert torch.allclose(batch["image"][k], torch.full((3, 16, 16), 10.0 * int(sid[1:]) / 255.0))
    assert sorted(seen) == sorted(unl_ids)
    assert isinstance(unl_ds, UnlabelledImageDataset)


def test_run_hook_writes_labelled_csv_and_manifest_sha(tmp_path: Path):
    """The run-folder hook of ``train_run`` (``labelled_train_ids``) on a real prepared dataset and cache:
    labelled.csv covers the training split, the labelled ids are the file's, and manifest.json records the
    file's SHA-256 (no training: the trainer is another stage)."""
    from msb.data.labelled import labelled_train_ids
    from msb.engine.runner import ensure_split, write_manifest

    root = tmp_path / "synthetic"
    make_synthetic_dataset(root, n_samples=20, size=(32, 32), seed=0)
    cfg = RunConfig.model_validate({
        "study": "t", "run_root": str(tmp_path / "runs"), "random_seed": 3,
        "data": {"name": "synthetic", "root": str(root), "input_size": [32, 32], "labelled_fraction": 0.3,
                 "split": {"mode": "random", "val_fraction": 0.2, "test_fraction": 0.2, "seed": 0},
                 "cache_dir": str(tmp_path / "cache")},
        "model": {"arch": "unet"},
    })
    run = GeneratedRun("run", cfg, config_hash(cfg), "synthetic", "unet")
    run_dir = tmp_path / "runs" / "t" / "run"
    run_dir.mkdir(parents=True)
    ds = load_prepared_dataset(root)
    splits = ensure_split(cfg, ds, run_dir)
    train_ids = sorted(s for s, v in splits.items() if v == "train")
    cache = build_cache(ds, (32, 32), tmp_path / "cache")
    ids = labelled_train_ids(cfg, run_dir, ds, cache, train_ids)
    lab = pd.read_csv(run_dir / LABELLED_FILE, dtype=str)
    assert sorted(lab["sample_id"]) == train_ids
    assert sorted(ids) == sorted(lab.loc[lab["labelled"] == "1", "sample_id"])
    assert 1 <= len(ids) < len(train_ids)
    assert labelled_train_ids(cfg, run_dir, ds, cache, train_ids) == ids  # resume: same subset
    write_manifest(run_dir, run, "cpu")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["labelled_sha256"] == hashlib.sha256((run_dir / LABELLED_FILE).read_bytes()).hexdigest()
