"""K-fold studies whose folds are all evaluated on one held-out test set: each fold is its own system."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd

from msb.analysis.counts.systems import align_tables, find_systems
from msb.evaluation.counts import counts_rows


def _fold_counts(run_id: str, fold: int, tp: list[int], model: str = "unet") -> pd.DataFrame:
    """Three 4x4 test images (ids a, b, c), one class; fp = fn = 1 each, tn the rest."""
    n = len(tp)
    tp_a = np.array(tp, dtype=np.int64)[:, None]
    one = np.ones((n, 1), dtype=np.int64)
    counts = dict(tp=tp_a, fp=one, fn=one, tn=16 - tp_a - 2, intersection=tp_a, reference=tp_a + 1,
                  predicted=tp_a + 1, union=tp_a + 2)
    ctx = dict(dataset="toy", split="test", fold=fold, run_id=run_id, model=model, checkpoint_role="best",
               checkpoint_sha256="a" * 64, config_hash="b" * 64, threshold=0.5, threshold_on="probability")
    return counts_rows(ctx, counts, image_ids=["a", "b", "c"], class_ids=[1], class_names=["polyp"],
                       heights=4, widths=4)


def test_folds_sharing_a_test_set_become_separate_systems(tmp_path):
    """Fold 0 has tp (4, 6, 8), fold 1 (2, 6, 10), the ensemble (5, 5, 5): image-level Dice of fold 0 on
    image a is 2*4/(2*4+1+1) = 0.8, so the systems' tables must keep the folds apart (3 images each)."""
    df = pd.concat([_fold_counts("toy-unet_r18-1234abcd-fold0", 0, [4, 6, 8]),
                    _fold_counts("toy-unet_r18-1234abcd-fold1", 1, [2, 6, 10]),
                    _fold_counts("toy-unet_r18-1234abcd-ensemble", -1, [5, 5, 5], model="unet-ensemble2")],
                   ignore_index=True)
    systems = find_systems(df)
    labels = sorted(s.label for s in systems)
    assert labels == ["unet_r18-1234abcd-ensemble", "unet_r18-fold0", "unet_r18-fold1"]
    aligned = align_tables({s.label: s.table() for s in systems})
    assert all(t.n_images == 3 for t in aligned.values())
    path = tmp_path / "counts.parquet"
    df.to_parquet(path)
    r = subprocess.run([sys.executable, "-m", "msb", "reaggregate", str(path), "--compare", "--bootstrap", "50"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "fold0" in r.stdout and "fold1" in r.stdout


def test_folds_on_disjoint_images_still_pool_into_one_system():
    """Classic cross-validation (each fold scored on its own held-out images) keeps one system per config."""
    f0 = _fold_counts("toy-unet_r18-1234abcd-fold0", 0, [4, 6, 8])
    f1 = _fold_counts("toy-unet_r18-1234abcd-fold1", 1, [2, 6, 10])
    f1["image_id"] = f1["image_id"].astype(str) + "2"
    systems = find_systems(pd.concat([f0, f1], ignore_index=True))
    assert [s.label for s in systems] == ["unet_r18"] and len(systems[0].run_ids) == 2


def test_two_input_sizes_of_one_study_get_two_labels():
    """Issue 12: the fold runs of one architecture at 128 and 192 px (study axis data.input_size) lost their
    config hash in the label and became one label; the variant slug now keeps them apart, folds and ensembles."""
    parts = []
    for h, size, tp in (("1234abcd", 128, [4, 6, 8]), ("99887766", 192, [2, 6, 10])):
        for j in (0, 1):
            f = _fold_counts(f"toy-unet_r18-{h}-fold{j}", j, tp)
            f["variant"] = f"data.input_size=[{size},{size}]"
            parts.append(f)
        e = _fold_counts(f"toy-unet_r18-{h}-ensemble", -1, [5, 5, 5], model="unet-ensemble2")
        e["variant"] = f"data.input_size=[{size},{size}]"
        parts.append(e)
    systems = find_systems(pd.concat(parts, ignore_index=True))
    labels = sorted(s.label for s in systems)
    assert labels == ["unet_r18-1234abcd-input_size128x128-ensemble", "unet_r18-99887766-input_size192x192-ensemble",
                      "unet_r18-input_size128x128-fold0", "unet_r18-input_size128x128-fold1",
                      "unet_r18-input_size192x192-fold0", "unet_r18-input_size192x192-fold1"]
    by_label = {s.label: s for s in systems}
    # fold 0 at 192 px is its own system: tp (2, 6, 10), image a Dice = 2*2/(2*2+1+1) = 2/3
    t = by_label["unet_r18-input_size192x192-fold0"].table()
    assert t.n_images == 3 and by_label["unet_r18-input_size192x192-fold0"].run_ids == ("toy-unet_r18-99887766-fold0",)
    model_labels = sorted({s.label for s in find_systems(pd.concat(parts, ignore_index=True), by="model")})
    assert model_labels == ["unet-ensemble2-input_size128x128", "unet-ensemble2-input_size192x192",
                            "unet-input_size128x128-fold0", "unet-input_size128x128-fold1",
                            "unet-input_size192x192-fold0", "unet-input_size192x192-fold1"]


def test_variant_slug_matches_the_unit_names():
    from msb.analysis.counts.systems import variant_slug
    from msb.config.generate import axes_slug

    axes = {"data.input_size": [128, 128], "random_seed": 1}
    assert variant_slug("data.input_size=[128,128];random_seed=1") == axes_slug(axes) == "input_size128x128-random_seed1"
    assert variant_slug("") == ""
