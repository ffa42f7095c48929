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


# ------------------------------------------------------------------ issue 21: integer-domain curves, mIoU, E max
def _sod_reference(maps_u8, gts):
    """py_sod_metrics, one object per metric stepped over the whole "dataset" (the official Python way)."""
    import py_sod_metrics as sod

    fm = sod.FmeasureV2(metric_handlers={
        "dice": sod.DICEHandler(with_dynamic=True, with_adaptive=False, sample_based=True),
        "iou": sod.IOUHandler(with_dynamic=True, with_adaptive=False, sample_based=True)})
    em = sod.Emeasure()
    for p, g in zip(maps_u8, gts):
        fm.step(pred=p, gt=g.astype(np.uint8) * 255)
        em.step(pred=p, gt=g.astype(np.uint8) * 255)
    r = fm.get_results()
    return r["dice"]["dynamic"], r["iou"]["dynamic"], em.get_results()["em"]["curve"]


def _acceptance_maps():
    """Maps of the acceptance list: every grey level 0..255 (16x16 = 256 pixels, a permutation: also values on
    every threshold k/255), a constant map, an empty reference, a map that is not min-max normalised
    (levels 37..201), and one float map."""
    rng = np.random.default_rng(21)
    every = rng.permutation(256).astype(np.uint8).reshape(16, 16)
    g_every = every >= 100
    g_every[0, :3] = ~g_every[0, :3]  # some reference pixels at low grey, some high grey outside
    const = np.full((9, 7), 133, np.uint8)
    g_const = np.zeros((9, 7), bool)
    g_const[2:5, 1:4] = True
    empty_ref = (rng.random((8, 8)) * 255).astype(np.uint8)
    g_empty = np.zeros((8, 8), bool)
    narrow = (37 + rng.random((12, 10)) * 164).astype(np.uint8)
    narrow[0, 0], narrow[0, 1] = 37, 201
    g_narrow = narrow > 120
    flt = rng.random((10, 10))
    g_flt = flt > 0.6
    return [every, const, empty_ref, narrow, flt], [g_every, g_const, g_empty, g_narrow, g_flt]


def test_mdice_maxdice_miou_maxiou_equal_pysodmetrics_to_1e12():
    """Per-image curves -> dataset mDice, maxDice, mIoU, maxIoU (``curve_scores``) equal py_sod_metrics'
    FmeasureV2 (DICEHandler / IOUHandler, dynamic, sample based) stepped over the same images, to 1e-12; the
    metric-table route (compute_image_metrics + summarize_metrics) gives the same; each maps is also scored
    alone against a library object of its own."""
    maps, gts = _acceptance_maps()
    assert set(np.unique(maps[0])) == set(range(256))
    dice_ref, iou_ref, em_ref = _sod_reference([legacy.to_uint8_map(m) for m in maps], gts)
    curves = [legacy.threshold_curves(m, g) for m, g in zip(maps, gts)]
    d = legacy.curve_scores(np.array([c["dice"] for c in curves]), "dice")
    i = legacy.curve_scores(np.array([c["iou"] for c in curves]), "iou")
    expected = {"mdice": np.mean(dice_ref), "maxdice": np.max(dice_ref), "miou": np.mean(iou_ref),
                "maxiou": np.max(iou_ref)}
    got = {**d, **i}
    assert all(abs(got[k] - v) <= 1e-12 for k, v in expected.items()), (got, expected)
    for (m, g), c in zip(zip(maps, gts), curves):  # every image alone
        dr, ir, _ = _sod_reference([legacy.to_uint8_map(m)], [g])
        np.testing.assert_allclose(c["dice"], dr, rtol=0, atol=1e-12)
        np.testing.assert_allclose(c["iou"], ir, rtol=0, atol=1e-12)
    import pandas as pd

    cfg = MetricsConfig(legacy=True)
    rows = [compute_image_metrics(legacy.to_uint8_map(m) >= 128, g, config=cfg, prob=m) for m, g in zip(maps, gts)]
    s = summarize_metrics(pd.DataFrame(rows).assign(class_id=1)).set_index(["metric", "aggregation"])["value"]
    for k, v in {**expected, "maxemeasure": np.max(em_ref), "memeasure": np.mean(em_ref)}.items():
        assert abs(s[(f"legacy_{k}", "threshold_curve")] - v) <= 1e-12, k


def test_integer_domain_curves_by_exact_counting():
    """The map with every grey level spans 0..255, so min-max is the identity and threshold k/255 means
    ``u >= k`` in integers: Dice and IoU at every k counted here by hand equal the curves (0 when TP = 0)."""
    maps, gts = _acceptance_maps()
    u, g = maps[0].astype(int), gts[0]
    dice, iou = [], []
    for k in range(255, -1, -1):
        p = u >= k
        tp, fp, fn = int((p & g).sum()), int((p & ~g).sum()), int((~p & g).sum())
        dice.append(2 * tp / (2 * tp + fp + fn) if tp else 0.0)
        iou.append(tp / (tp + fp + fn) if tp else 0.0)
    c = legacy.threshold_curves(maps[0], g)
    np.testing.assert_allclose(c["dice"], dice, rtol=0, atol=1e-15)
    np.testing.assert_allclose(c["iou"], iou, rtol=0, atol=1e-15)


def test_miou_hand_example_constant_map_and_empty_reference():
    """Hand example MAP -> min-max [[1, .625], [.25, 0]], binned uint8(255 x) = [[255, 159], [63, 0]]:
    k = 160..255 (96): P = {1} -> IoU 1/2; k = 64..159 (96): P = top row -> 1; k = 1..63 (63): 3 px -> 2/3;
    k = 0: 4 px -> 1/2. mIoU = (48 + 96 + 42 + 0.5) / 256 = 0.728515625, maxIoU = 1.
    A constant map (no min-max; 133/255 -> bin 133) on a 9-pixel reference of 63: P = all for k <= 133:
    IoU 9/63 there, 0 above -> mIoU = 134 * (9/63) / 256. An empty reference: IoU and Dice 0 everywhere."""
    c = legacy.threshold_curves(MAP, REF)
    assert legacy.curve_scores(c["iou"][None], "iou") == {"miou": pytest.approx(0.728515625, abs=1e-15),
                                                          "maxiou": 1.0}
    maps, gts = _acceptance_maps()
    const = legacy.threshold_curves(maps[1], gts[1])
    assert const["iou"].mean() == pytest.approx(134 * (9 / 63) / 256, abs=1e-15)
    empty = legacy.threshold_curves(maps[2], gts[2])
    assert not empty["dice"].any() and not empty["iou"].any()
