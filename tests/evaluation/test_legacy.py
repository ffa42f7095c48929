"""LEGACY PraNet-template metrics: the threshold-averaged "mDice" and the pysodmetrics wrappers."""

from __future__ import annotations

import numpy as np
import pytest

from _oracle import close, load_case, shared_dir
from msb.config.metrics_schema import MetricsConfig
from msb.evaluation import legacy
from msb.evaluation.image_metrics import compute_image_metrics, summarize_metrics

MAP = np.array([[250, 160], [70, 10]], np.uint8)
REF = np.array([[1, 1], [0, 0]], bool)


def test_mdice_hand_example():
    """uint8 map [[250, 160], [70, 10]] -> /255 -> min-max -> [[1, 0.625], [0.25, 0]]; reference = top row.

    Thresholds t_i = 1 - i/255, i = 0..255, foreground = map >= t:
    * i = 0..95 (t > 0.625, 96 thresholds): P = {1}        -> Dice 2*1/(1+2) = 2/3
    * i = 96..191 (0.25 < t <= 0.625, 96):  P = {1, .625}  -> Dice 1
    * i = 192..254 (0 < t <= 0.25, 63):     P = 3 pixels   -> Dice 2*2/(3+2) = 0.8
    * i = 255 (t = 0, 1):                   P = 4 pixels   -> Dice 4/6 = 2/3
    mDice = (96*2/3 + 96 + 63*0.8 + 2/3) / 256 = (3166/15)/256 = 0.82447916...; maxDice = 1.
    Dice at 0.5 on the raw map (250/255, 160/255 >= 0.5) = 1: the legacy number is 0.18 lower here.
    MAE on the normalised map = (0 + 0.375 + 0.25 + 0) / 4 = 0.15625.
    """
    curve = legacy.threshold_dice_curve(MAP, REF)
    assert curve.shape == (256,)
    assert np.allclose(curve[:96], 2 / 3) and np.allclose(curve[96:192], 1.0)
    assert np.allclose(curve[192:255], 0.8) and curve[255] == pytest.approx(2 / 3)
    scores = legacy.polyp_mdice(curve[None, :])
    assert scores["mdice"] == pytest.approx(3166 / 3840, abs=1e-12)
    assert scores["maxdice"] == 1.0
    assert legacy.sod_metrics(MAP, REF)["legacy_mae"] == pytest.approx(0.15625, abs=1e-12)


def test_dice_is_zero_when_tp_is_zero():
    """MATLAB ``Fmeasure_calu``: Dice = 0 whenever TP = 0, even for an empty reference and prediction,
    so a constant-zero map on an empty reference scores mDice 0 (Dice of two empty sets is undefined)."""
    zero = np.zeros((4, 4), np.uint8)
    assert np.all(legacy.threshold_dice_curve(zero, np.zeros((4, 4), bool))[:-1] == 0.0)


@pytest.mark.shared_data
def test_mdice_far_from_dice_at_half_on_low_confidence_case():
    """Oracle case ``low_confidence_prob_224``: probabilities <= 0.37, so the honest prediction at 0.5 is
    empty and Dice@0.5 = 0 (the oracle's ``dice``). The legacy protocol min-max stretches the map to
    [0, 1] and invents a lesion: its mDice equals the value of a plain per-threshold loop written here
    (0.2166 for this map) and is > 0.2 above Dice@0.5, its maxDice > 0.35. Old "mDice" tables are
    therefore not comparable with Dice at 0.5."""
    _, gt, _, ref = load_case("low_confidence_prob_224")
    prob = np.load(shared_dir("oracle") / "cases" / "low_confidence_prob_224.npz")["pred_prob"]
    dice_at_half = float(ref["oracle_numpy"]["dice"])
    assert dice_at_half == 0.0 and not (prob >= 0.5).any()
    # independent loop: uint8 quantisation (stored maps), /255, min-max, 256 thresholds, Dice 0 if TP = 0
    m = np.rint(prob * 255).astype(np.uint8) / 255.0
    m = (m - m.min()) / (m.max() - m.min())
    loop = []
    for t in np.linspace(1, 0, 256):
        p = m >= t
        tp = int((p & gt).sum())
        loop.append(2 * tp / (p.sum() + gt.sum()) if tp else 0.0)
    curve = legacy.threshold_dice_curve(prob, gt)
    assert np.allclose(curve, loop, atol=1e-12, rtol=0)
    scores = legacy.polyp_mdice(curve[None, :])
    assert scores["mdice"] - dice_at_half > 0.2
    assert scores["maxdice"] > 0.35


def test_sod_wrappers_equal_the_library():
    """The wrappers feed pysodmetrics uint8 maps (round(255 p)) and uint8 references (0/255) and return
    its per-image results: compare with direct library calls on a random map."""
    import py_sod_metrics as sod

    rng = np.random.default_rng(0)
    prob = rng.random((40, 50))
    ref = np.zeros((40, 50), bool)
    ref[10:25, 12:30] = True
    pred_u8 = np.rint(prob * 255).astype(np.uint8)
    gt_u8 = ref.astype(np.uint8) * 255
    expected = {}
    for name, cls in (("legacy_smeasure", sod.Smeasure), ("legacy_wfmeasure", sod.WeightedFmeasure),
                      ("legacy_mae", sod.MAE)):
        obj = cls()
        obj.step(pred=pred_u8, gt=gt_u8)
        expected[name] = float(next(iter(obj.get_results().values())))
    em = sod.Emeasure()
    em.step(pred=pred_u8, gt=gt_u8)
    expected["legacy_emeasure_mean"] = float(np.mean(em.get_results()["em"]["curve"]))
    expected["legacy_emeasure_adaptive"] = float(em.get_results()["em"]["adp"])
    got = legacy.sod_metrics(prob, ref)
    assert all(close(got[k], v, atol=1e-12) for k, v in expected.items()), (got, expected)


def test_identical_binary_map_scores_perfectly():
    """A binary map equal to the reference: S-measure 1, weighted F 1, MAE 0 (definitions: all structure
    and region terms are perfect, no error pixels)."""
    m = np.zeros((30, 30), bool)
    m[5:15, 5:20] = True
    s = legacy.sod_metrics(m.astype(float), m)
    assert s["legacy_smeasure"] == pytest.approx(1.0, abs=1e-9)
    assert s["legacy_wfmeasure"] == pytest.approx(1.0, abs=1e-9)
    assert s["legacy_mae"] == 0.0


def test_legacy_columns_in_image_metrics_and_summary():
    """``legacy: true`` adds the columns (and requires the map); the summary's dataset mDice of two images
    is the mean of their per-image means, maxDice the max of the mean curve: here the hand example twice
    -> 0.82447916... and 1."""
    cfg = MetricsConfig(legacy=True)
    with pytest.raises(ValueError):
        compute_image_metrics(REF, REF, config=cfg)
    import pandas as pd

    rows = [compute_image_metrics(MAP >= 128, REF, config=cfg, prob=MAP) for _ in range(2)]
    assert rows[0]["legacy_mdice"] == pytest.approx(3166 / 3840)
    table = pd.DataFrame(rows).assign(class_id=1)
    s = summarize_metrics(table).set_index(["metric", "aggregation"])["value"]
    assert s[("legacy_mdice", "threshold_curve")] == pytest.approx(3166 / 3840)
    assert s[("legacy_maxdice", "threshold_curve")] == 1.0
