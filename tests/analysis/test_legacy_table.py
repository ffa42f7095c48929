"""The LEGACY six-metric table layout (``msb.analysis.report.legacy_table``) from metrics rows written here."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from msb.analysis.report.legacy_table import (LEGACY_LABEL, SIX_METRICS, legacy_report_table, legacy_scores,
                                       six_metric_table, write_six_metric_table)


def _rows(model: str, dataset: str, dice_levels: list[float], e_max_at: int) -> list[dict]:
    """Two images per (model, dataset) with flat Dice curves at the given levels (mDice = their mean, maxDice the
    same), IoU = Dice / 2, an E curve 0.5 everywhere but 0.9 at one threshold for both images (max 0.9, mean
    (255 * 0.5 + 0.9) / 256), S = 0.7 / 0.8, wF = 0.6 / 0.4, MAE = 0.1 / 0.3."""
    out = []
    for k, lvl in enumerate(dice_levels):
        e = np.full(256, 0.5)
        e[e_max_at] = 0.9
        out.append({"model": model, "dataset": dataset, "image_id": f"{dataset}{k}", "class_id": 1,
                    "run_id": f"{model}-{dataset}", "checkpoint_role": "scored",
                    "legacy_dice_curve": [lvl] * 256, "legacy_iou_curve": [lvl / 2] * 256,
                    "legacy_emeasure_curve": e.tolist(), "legacy_smeasure": [0.7, 0.8][k],
                    "legacy_wfmeasure": [0.6, 0.4][k], "legacy_mae": [0.1, 0.3][k]})
    return out


def test_six_metric_layout_values_and_labels(tmp_path):
    df = pd.DataFrame(_rows("A", "Kvasir", [0.8, 0.6], 3) + _rows("A", "ClinicDB", [1.0, 0.5], 10)
                      + _rows("B", "Kvasir", [0.2, 0.4], 200))
    scores = legacy_scores(df)
    t = six_metric_table(scores)
    assert list(t.index) == ["A", "B"] and t.index.name == "model"
    assert [m for _, m in t.columns][:7] == list(SIX_METRICS)
    assert t.loc["A", ("Kvasir", "mDice")] == pytest.approx(0.7, abs=1e-15)
    assert t.loc["A", ("ClinicDB", "mIoU")] == pytest.approx(0.375, abs=1e-15)
    assert t.loc["B", ("Kvasir", "E_phi_max")] == pytest.approx(0.9, abs=1e-15)
    assert t.loc["B", ("Kvasir", "E_phi_mean")] == pytest.approx((255 * 0.5 + 0.9) / 256, abs=1e-15)
    assert t.loc["A", ("Kvasir", "S_alpha")] == pytest.approx(0.75) and t.loc["A", ("Kvasir", "MAE")] == pytest.approx(0.2)
    assert np.isnan(t.loc["B", ("ClinicDB", "mDice")])  # B was not scored on ClinicDB
    max_dice = scores[(scores.system == "A") & (scores.dataset == "ClinicDB") & (scores.metric == "maxDice")]
    assert float(max_dice["value"].iloc[0]) == pytest.approx(0.75)
    csv, tex, md = write_six_metric_table(t, tmp_path)
    back = pd.read_csv(csv, index_col=0)
    assert "LEGACY" in back.index.name and back.loc["A", "Kvasir/mDice"] == pytest.approx(0.7, abs=1e-12)
    assert LEGACY_LABEL in tex.read_text() and r"$E^{max}_{\phi}$" in tex.read_text()
    assert LEGACY_LABEL in md.read_text() and "0.700" in md.read_text()
    flat = legacy_report_table(pd.concat([df, pd.DataFrame([{"model": "C", "dataset": "Kvasir"}])]))
    assert list(flat["model"]) == ["A", "B"] and "Kvasir mDice" in flat.columns  # rows without legacy skipped
    assert legacy_report_table(pd.DataFrame([{"model": "C", "dataset": "Kvasir", "hd95": 1.0}])) is None


def test_two_evaluations_of_one_model_are_labelled_and_missing_columns_refused():
    df = pd.DataFrame(_rows("A", "Kvasir", [0.8, 0.6], 3)
                      + [dict(r, run_id="A-other") for r in _rows("A", "Kvasir", [0.2, 0.2], 3)])
    t = six_metric_table(legacy_scores(df))
    assert list(t.index) == ["A [A-Kvasir/scored]", "A [A-other/scored]"]
    from msb.errors import MSBError

    with pytest.raises(MSBError, match="--legacy"):
        legacy_scores(df.drop(columns=["legacy_iou_curve"]))
