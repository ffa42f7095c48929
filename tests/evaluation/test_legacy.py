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


def _sod_dice_curves(preds_u8, gts):
    """Reference: pysodmetrics' threshold-wise Dice (FmeasureV2 + DICEHandler), one object over the dataset
    (as the PraNet-style evaluation scripts run it), and one per image."""
    import py_sod_metrics as sod

    def new():
        return sod.FmeasureV2(metric_handlers={"dice": sod.DICEHandler(with_dynamic=True, with_adaptive=False)})

    dataset, per_image = new(), []
    for p, g in zip(preds_u8, gts):
        g_u8 = g.astype(np.uint8) * 255
        dataset.step(pred=p, gt=g_u8)
        one = new()
        one.step(pred=p, gt=g_u8)
        per_image.append(one.get_results()["dice"]["dynamic"])
    return dataset.get_results()["dice"]["dynamic"], np.array(per_image)


def test_dice_curve_and_mdice_equal_pysodmetrics_on_8bit_maps():
    """Hand-made 8-bit maps: the per-image curves and the dataset mDice/maxDice equal pysodmetrics'.

    Map A holds 0 and 255, so the min-max step is the identity and its pixel of value 4 sits exactly on
    4/255, where ``np.linspace(1, 0, 256)[251]`` is one ulp larger than 4/255: a threshold taken from linspace
    would drop that pixel at t = 4/255 (the earlier bug). Its curve is also checked against exact integer
    counting (``u >= k``). Map B needs min-max (10..250), C is constant, D has an empty reference, E is a
    float map quantised with round(255 p)."""
    a = np.array([[255, 4, 4, 0], [200, 4, 130, 0], [0, 0, 36, 37]], np.uint8)
    ga = np.array([[1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 1]], bool)
    b = np.array([[250, 160, 26], [70, 10, 130], [11, 249, 100]], np.uint8)
    gb = np.array([[1, 1, 0], [0, 0, 1], [0, 1, 1]], bool)
    c = np.full((3, 3), 77, np.uint8)
    gc = np.eye(3, dtype=bool)
    d = np.array([[0, 255, 20], [5, 4, 3]], np.uint8)
    gd = np.zeros((2, 3), bool)
    e_prob = np.array([[0.0, 0.5, 1.0], [0.2, 0.8, 0.0157]])
    ge = np.array([[0, 1, 1], [0, 1, 0]], bool)
    maps = [a, b, c, d, e_prob]
    gts = [ga, gb, gc, gd, ge]
    curves = np.array([legacy.threshold_dice_curve(m, g) for m, g in zip(maps, gts)])
    ds_curve, per_image = _sod_dice_curves([legacy.to_uint8_map(m) for m in maps], gts)
    np.testing.assert_array_equal(curves, per_image)
    scores = legacy.polyp_mdice(curves)
    assert scores["mdice"] == pytest.approx(float(np.mean(ds_curve)), rel=0, abs=1e-15)
    assert scores["maxdice"] == pytest.approx(float(np.max(ds_curve)), rel=0, abs=1e-15)

    # map A by exact integer counting: threshold k/255 <=> u >= k (A spans 0..255, so min-max is the identity)
    exact = []
    for k in range(255, -1, -1):
        p = a.astype(int) >= k
        tp = int((p & ga).sum())
        exact.append(2 * tp / (p.sum() + ga.sum()) if tp else 0.0)
    np.testing.assert_allclose(curves[0], exact, rtol=0, atol=1e-15)
    i4 = 255 - 4  # threshold 4/255
    assert legacy.LEGACY_THRESHOLDS[i4] == 4 / 255
    assert np.linspace(1, 0, 256)[i4] > 4 / 255  # the old thresholds miss the pixels of value 4 here ...
    old = a / 255 >= np.linspace(1, 0, 256)[i4]
    # old: P = {255, 200, 130, 36, 37}, TP = 4 -> 8/11; library: the three 4s join, TP = 6 -> 12/14
    assert int(old.sum()) == 5 and int((old & ga).sum()) == 4
    assert curves[0][i4] == pytest.approx(12 / 14, rel=0, abs=1e-15)
    assert legacy.legacy_metrics(a, ga)["legacy_mdice"] == pytest.approx(float(np.mean(exact)), abs=1e-15)
