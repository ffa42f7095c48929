"""Wilcoxon tests between fold-trained models: one paired unit per image, not per (fold, image) row.

Hand-built study (2 folds x 6 external images, 2 folds x 6 shared internal test images, 2 models). Expected values
are recomputed with pandas from the stored counts.parquet files and ``scipy.stats.wilcoxon`` on the per-image
fold means (internal split, no ensemble; external set once its ensemble folders are removed) or on the fold
ensemble's per-image Dice (external set with ensembles).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

sys.path.insert(0, str(Path(__file__).parent))
from _protocol_study import build_study  # noqa: E402

from msb.analysis.protocol import wilcoxon  # noqa: E402
from msb.analysis.protocol.inputs import load_study  # noqa: E402


def _dice(df: pd.DataFrame) -> np.ndarray:
    tp, fp, fn = (df[c].to_numpy(dtype=float) for c in ("tp", "fp", "fn"))
    den = 2 * tp + fp + fn
    return np.where(den > 0, 2 * tp / np.where(den > 0, den, 1), np.nan)


def _per_image(study: Path, arch: str, pattern: str) -> pd.Series:
    """Per image_id the mean Dice over the counts files matching ``pattern`` of ``arch`` (plain pandas)."""
    files = sorted(study.glob(f"kv-{arch}-*{pattern}"))
    df = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
    return df.assign(d=_dice(df)).groupby("image_id")["d"].mean().sort_index(), len(files)


def _tidy(study: Path) -> pd.DataFrame:
    return wilcoxon.run(load_study(study), {"n_boot": 200, "seed": 0}).data["wilcoxon"]


def _row(tidy: pd.DataFrame, test_set: str) -> pd.Series:
    t = tidy[(tidy["test_set"] == test_set) & (tidy["metric"] == "dice")]
    assert len(t) == 1
    return t.iloc[0]


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    return build_study(tmp_path_factory.mktemp("wx"), archs=("segf", "unet"), sizes=(-1,), folds=(0, 1),
                       n_test=6, n_ext=6, metrics=False, profile=False)


def test_shared_test_split_uses_the_per_image_fold_mean(study):
    a, na = _per_image(study, "segf", "-fold*/evaluation/best/counts.parquet")
    b, nb = _per_image(study, "unet", "-fold*/evaluation/best/counts.parquet")
    assert na == nb == 2 and len(a) == 6
    row = _row(_tidy(study), "kv")
    assert int(row["n"]) == 6
    assert float(row["p_value"]) == pytest.approx(stats.wilcoxon(a.to_numpy(), b.to_numpy()).pvalue)
    assert float(row["mean_difference"]) == pytest.approx(float((a - b).mean()))
    assert row["values_a"] == row["values_b"] == "mean over folds (2)"


def test_external_set_uses_the_fold_ensemble(study):
    a, _ = _per_image(study, "segf", "-ensemble/evaluation/external/cvc/best/counts.parquet")
    b, _ = _per_image(study, "unet", "-ensemble/evaluation/external/cvc/best/counts.parquet")
    row = _row(_tidy(study), "cvc")
    assert int(row["n"]) == 6 and row["values_a"] == "fold ensemble"
    assert float(row["p_value"]) == pytest.approx(stats.wilcoxon(a.to_numpy(), b.to_numpy()).pvalue)
    assert float(row["mean_difference"]) == pytest.approx(float((a - b).mean()))
    assert float(row["ci_low"]) <= float((a - b).mean()) <= float(row["ci_high"])


def test_external_set_without_ensemble_uses_the_fold_mean(study, tmp_path):
    s = tmp_path / "study"
    shutil.copytree(study, s)
    for d in s.glob("*-ensemble"):
        shutil.rmtree(d)
    a, _ = _per_image(s, "segf", "-fold*/evaluation/external/cvc/best/counts.parquet")
    b, _ = _per_image(s, "unet", "-fold*/evaluation/external/cvc/best/counts.parquet")
    row = _row(_tidy(s), "cvc")
    assert int(row["n"]) == 6 and row["values_b"] == "mean over folds (2)"
    assert float(row["p_value"]) == pytest.approx(stats.wilcoxon(a.to_numpy(), b.to_numpy()).pvalue)
    assert float(row["mean_difference"]) == pytest.approx(float((a - b).mean()))
