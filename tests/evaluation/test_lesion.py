"""Lesion-level detection against the oracle's ``lesion_detection`` block and hand-derived cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from _oracle import case_names, load_case
from msb.evaluation import lesion

CASES = case_names()
ORACLE_KEYS = {"any_overlap": "any_overlap", "centroid_in_reference": "centroid_in_gt", "iou": "iou_ge_0.5"}


@pytest.mark.shared_data
@pytest.mark.parametrize("name", CASES)
def test_component_counts_match_oracle(name):
    """Component counts with 8- and 4-connectivity equal ``n_*_cc8`` / ``n_*_cc4`` of the oracle."""
    pred, gt, _, ref = load_case(name)
    block = ref["lesion_detection"]
    for conn in (8, 4):
        assert lesion.label_components(pred, conn)[1] == block[f"n_pred_cc{conn}"]
        assert lesion.label_components(gt, conn)[1] == block[f"n_gt_cc{conn}"]


@pytest.mark.shared_data
@pytest.mark.parametrize("criterion", sorted(ORACLE_KEYS))
@pytest.mark.parametrize("name", CASES)
def test_matching_matches_oracle(name, criterion):
    """TP / FP / FN (and ``tp_pred`` where given) under each rule equal the oracle (8-connectivity, t=0.5)."""
    pred, gt, _, ref = load_case(name)
    expected = ref["lesion_detection"][ORACLE_KEYS[criterion]]
    m = lesion.match_lesions(pred, gt, criterion, connectivity=8, iou_threshold=0.5)
    got = {"tp": m.tp, "fp": m.fp, "fn": m.fn, "tp_pred": m.tp_pred}
    assert {k: got[k] for k in expected} == expected


@pytest.mark.shared_data
@pytest.mark.parametrize("name", CASES)
def test_iou_strictly_above_half_matches_metrics_reloaded(name):
    """MetricsReloaded matches a pair when IoU > 0.5; our rule is IoU >= t, so t = nextafter(0.5, 1)
    reproduces its TP/FP/FN (it differs from t = 0.5 exactly on ``iou_exactly_half_64``)."""
    pred, gt, _, ref = load_case(name)
    mr = ref["metricsreloaded"]["lesion_mask_iou_gt_0.5"]
    m = lesion.match_lesions(pred, gt, "iou", iou_threshold=float(np.nextafter(0.5, 1.0)))
    assert (m.tp, m.fp, m.fn) == (mr["tp"], mr["fp"], mr["fn"])


def _blank(shape=(20, 20)):
    return np.zeros(shape, bool)


def test_merged_prediction_many_to_one_vs_one_to_one():
    """Two 3x3 reference lesions (cols 2-4 and 8-10, rows 2-4) covered by one prediction bar (rows 2-4,
    cols 2-10, 27 px). any_overlap: both lesions touched -> TP 2, FN 0, one predicted component matched
    (tp_pred 1), FP 0 -> sensitivity 1, precision 1. iou: each pair has IoU 9/27 = 1/3 < 0.5 -> TP 0, FN 2,
    FP 1. centroid: the bar's centroid (3, 6) lies between the lesions -> TP 0, FN 2, FP 1."""
    ref = _blank()
    ref[2:5, 2:5] = True
    ref[2:5, 8:11] = True
    pred = _blank()
    pred[2:5, 2:11] = True
    m = lesion.match_lesions(pred, ref, "any_overlap")
    assert (m.tp, m.fn, m.fp, m.tp_pred) == (2, 0, 0, 1)
    assert lesion.lesion_scores(m) == {"sensitivity": 1.0, "precision": 1.0, "f1": 1.0}
    m = lesion.match_lesions(pred, ref, "iou")
    assert (m.tp, m.fn, m.fp) == (0, 2, 1)
    m = lesion.match_lesions(pred, ref, "centroid_in_reference")
    assert (m.tp, m.fn, m.fp) == (0, 2, 1)


def test_iou_threshold_and_greedy_one_to_one():
    """Reference 4x4 lesion R (16 px, rows 2-5, cols 2-5). Prediction A = rows 2-5, cols 2-4 (12 px,
    inside R: IoU 12/16 = 0.75) and B = rows 2-5, col 6 (4 px, disjoint from R: IoU 0).
    t = 0.5: A matches R -> TP 1, FP 1 (B), FN 0, F1 = 2*1*0.5/1.5 = 2/3.
    t = 0.8: 0.75 < 0.8 -> TP 0, FP 2, FN 1, F1 = 0."""
    ref = _blank()
    ref[2:6, 2:6] = True
    pred = _blank()
    pred[2:6, 2:5] = True
    pred[2:6, 6] = True
    m = lesion.match_lesions(pred, ref, "iou", iou_threshold=0.5)
    assert (m.tp, m.fp, m.fn) == (1, 1, 0)
    assert lesion.lesion_scores(m)["f1"] == pytest.approx(2 / 3)
    m = lesion.match_lesions(pred, ref, "iou", iou_threshold=0.8)
    assert (m.tp, m.fp, m.fn) == (0, 2, 1)
    assert lesion.lesion_scores(m)["f1"] == 0.0


def test_min_area_and_connectivity():
    """A 3x3 lesion plus a diagonal pair of pixels (1,15),(2,16). 8-connectivity: 2 components (9 px and
    2 px); 4-connectivity: 3 (the diagonal pair splits). min_area=3 removes the 2-px (8-conn) component,
    leaving 1; with 4-conn, min_area=2 removes both single pixels."""
    m = _blank()
    m[5:8, 5:8] = True
    m[1, 15] = m[2, 16] = True
    assert lesion.label_components(m, 8)[1] == 2
    assert lesion.label_components(m, 4)[1] == 3
    assert lesion.label_components(m, 8, min_area=3)[1] == 1
    assert lesion.label_components(m, 4, min_area=2)[1] == 1
    # min_area applies to the prediction too: the speck no longer counts as a false positive
    ref = _blank()
    ref[5:8, 5:8] = True
    assert lesion.match_lesions(m, ref, "any_overlap").fp == 1
    assert lesion.match_lesions(m, ref, "any_overlap", min_area=3).fp == 0


def test_scores_with_empty_sides():
    """Empty-side ratios follow the policy: no reference lesion -> sensitivity NaN, precision 0 with a
    false alarm, F1 0; no predicted component -> precision NaN, sensitivity 0, F1 0; none at all -> all NaN."""
    ref = _blank()
    ref[2:4, 2:4] = True
    s = lesion.lesion_scores(lesion.match_lesions(ref, _blank(), "any_overlap"))
    assert math.isnan(s["sensitivity"]) and s["precision"] == 0.0 and s["f1"] == 0.0
    s = lesion.lesion_scores(lesion.match_lesions(_blank(), ref, "any_overlap"))
    assert math.isnan(s["precision"]) and s["sensitivity"] == 0.0 and s["f1"] == 0.0
    s = lesion.lesion_scores(lesion.match_lesions(_blank(), _blank(), "iou"))
    assert all(math.isnan(v) for v in s.values())


def test_lesion_metrics_columns_and_errors():
    """Column keys: ``iou_ge_<t>`` carries the threshold; unknown rules and bad thresholds raise."""
    ref = _blank()
    ref[2:4, 2:4] = True
    cols = lesion.lesion_metrics(ref, ref, ["any_overlap", "iou"], iou_threshold=0.3)
    assert cols["lesion_iou_ge_0.3_tp"] == 1 and cols["lesion_any_overlap_f1"] == 1.0
    assert cols["n_lesions_pred"] == cols["n_lesions_ref"] == 1
    with pytest.raises(ValueError):
        lesion.match_lesions(ref, ref, "bounding_box")
    with pytest.raises(ValueError):
        lesion.match_lesions(ref, ref, "iou", iou_threshold=0.0)


def test_centroid_rounding_is_in_image_coordinates():
    """Prediction = pixels (5, 3) and (5, 4): centre of mass (5, 3.5). ``numpy.rint`` rounds the tie to
    the even column 4, so the centroid lies in a reference pixel at (5, 4) (TP) and not in one at (5, 3)
    (FP + FN). The rounding is done in image coordinates, so cropping cannot change the result."""
    pred = _blank()
    pred[5, 3:5] = True
    ref4 = _blank()
    ref4[5, 4] = True
    ref3 = _blank()
    ref3[5, 3] = True
    m = lesion.match_lesions(pred, ref4, "centroid_in_reference")
    assert (m.tp, m.fp, m.fn) == (1, 0, 0)
    m = lesion.match_lesions(pred, ref3, "centroid_in_reference")
    assert (m.tp, m.fp, m.fn) == (0, 1, 1)
