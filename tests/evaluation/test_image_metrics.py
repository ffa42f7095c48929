"""Per image x class metrics, the metrics table round trip, the summary and the empty-mask policy."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from msb.config.metrics_schema import MetricsConfig
from msb.errors import MSBError
from msb.evaluation import empty_policy
from msb.evaluation.image_metrics import (
    compute_image_metrics,
    metrics_table_from_predictions,
    summarize_metrics,
    write_metrics_table,
    write_run_metrics,
)

DIAG_64 = math.sqrt(64 ** 2 + 64 ** 2)  # 90.50966799187809


def _rect(shape, r0, c0, h, w):
    m = np.zeros(shape, bool)
    m[r0:r0 + h, c0:c0 + w] = True
    return m


def _hd95_4_pair():
    """10x12 rectangles offset by 4 columns in a 64x64 image.

    P->R over the 40 boundary pixels of the prediction: its top and bottom rows give [4,3,2,1] then 8
    zeros (shared rows); its left column (8 interior rows) gives min(4, j, 9-j) = [1,2,3,4,4,3,2,1]; its
    right column lies inside the reference, nearest boundary min(4, j, 9-j) again. Six of 40 values are 4
    (15% > 5%), the rest smaller, so every 95th percentile is 4 (pooled and directed; R->P is the mirror
    image). HD95 = 4 in every pixel convention.
    """
    return _rect((64, 64), 20, 10, 10, 12), _rect((64, 64), 20, 14, 10, 12)


def _write_npz(path, pred, ref, spacing=(1.0, 1.0), class_ids=(1,), prob=None):
    pred = np.asarray(pred, bool)
    ref = np.asarray(ref, bool)
    prob = pred.astype(np.uint8) * 255 if prob is None else prob
    np.savez_compressed(path, pred=pred, ref=ref, prob=prob, spacing=np.asarray(spacing, np.float64),
                        class_ids=np.asarray(class_ids, np.int64))


def test_columns_conventions_and_no_inf():
    """Every row records its conventions, units and connectivities; no value is inf in any empty case."""
    pred, ref = _hd95_4_pair()
    empty = np.zeros_like(pred)
    cfg = MetricsConfig()
    for p, r, case in ((pred, ref, "none"), (empty, empty, "both_empty"), (pred, empty, "ref_empty"),
                       (empty, ref, "pred_empty")):
        m = compute_image_metrics(p, r, config=cfg)
        assert m["empty_case"] == case
        assert m["hd_convention"] == "metrics_reloaded" and m["nsd_convention"] == "metrics_reloaded"
        assert m["nsd_tolerance_unit"] == "px" and m["boundary_connectivity"] == 4
        assert m["lesion_connectivity"] == 8
        assert {"nsd_tau1px", "nsd_tau2px", "nsd_tau5px", "lesion_iou_ge_0.5_f1",
                "lesion_centroid_in_reference_tp"} <= set(m)
        assert not any(isinstance(v, float) and math.isinf(v) for v in m.values())
    assert compute_image_metrics(pred, ref, config=cfg)["hd95"] == 4.0


def test_policy_table_values():
    """The four empty cases against :data:`POLICY` (64x64 image, spacing 1: penalty = 90.50966799...)."""
    pred, ref = _hd95_4_pair()
    empty = np.zeros_like(pred)
    pairs = {"both_empty": (empty, empty), "ref_empty": (pred, empty), "pred_empty": (empty, ref)}
    for case, (p, r) in pairs.items():
        m = compute_image_metrics(p, r)
        assert m["distance_penalty"] == pytest.approx(DIAG_64)
        rule = empty_policy.POLICY["distance (hd, hd95, assd, masd, directed)"][case]
        for key in empty_policy.DISTANCE_KEYS:
            assert math.isnan(m[key]) if rule == "nan" else m[key] == pytest.approx(DIAG_64)
        rule = empty_policy.POLICY["nsd_tau*"][case]
        assert math.isnan(m["nsd_tau1px"]) if rule == "nan" else m["nsd_tau1px"] == rule
        for metric in ("sensitivity", "precision", "f1"):
            rule = empty_policy.POLICY[f"lesion_*_{metric}"][case]
            v = m[f"lesion_any_overlap_{metric}"]
            assert math.isnan(v) if rule == "nan" else v == rule
    assert "| both empty |" in empty_policy.policy_markdown()


def test_penalty_exceeds_every_attainable_distance():
    """Objects in opposite corners of a 64x64 image: pixel centres (0,0) and (63,63) are 63*sqrt(2) = 89.1
    apart; pixel corners 64*sqrt(2) = 90.51 (DeepMind contours). The penalty (90.51) is >= both."""
    a = np.zeros((64, 64), bool)
    a[0, 0] = True
    b = np.zeros((64, 64), bool)
    b[63, 63] = True
    for conv in ("metrics_reloaded", "medpy", "surface_distance"):
        m = compute_image_metrics(a, b, config=MetricsConfig(hd_convention=conv))
        assert m["hd"] <= m["distance_penalty"] + 1e-9
    assert compute_image_metrics(a, b)["hd"] == pytest.approx(63 * math.sqrt(2))


def test_a_miss_never_improves_mean_hd95():
    """MONAI's failure (oracle ``probes``): HD95 of images scoring 4, 4 and a complete miss aggregates to
    4.0 because the miss is NaN and dropped. Here the miss scores the penalty: mean = (4 + 4 + 90.5097)/3
    = 32.8365560.

    Then a dataset of 8 images whose predictions are the reference shifted by s = 1..8 columns; model k
    misses the k hardest images (largest shift). Dropping misses (NaN, as MONAI) makes the mean HD95 fall
    as k grows; under our policy the mean never falls.
    """
    pred, ref = _hd95_4_pair()
    rows = [compute_image_metrics(pred, ref), compute_image_metrics(pred, ref),
            compute_image_metrics(np.zeros_like(ref), ref)]
    table = pd.DataFrame(rows).assign(class_id=1)
    s = summarize_metrics(table).set_index(["metric", "aggregation"])
    assert s.loc[("hd95", "image_mean"), "value"] == pytest.approx((8 + DIAG_64) / 3)
    assert s.loc[("hd95", "image_mean"), "n_policy"] == 1 and s.loc[("hd95", "image_mean"), "n_nan"] == 0

    ref = _rect((64, 64), 20, 20, 16, 16)
    shifted = [np.roll(ref, s, axis=1) for s in range(1, 9)]
    ours, dropped = [], []
    for k in range(0, 9):
        preds = shifted[:8 - k] + [np.zeros_like(ref)] * k
        table = pd.DataFrame([compute_image_metrics(p, ref) for p in preds]).assign(class_id=1)
        mean = summarize_metrics(table).set_index(["metric", "aggregation"]).loc[("hd95", "image_mean"), "value"]
        ours.append(mean)
        monai_like = table["hd95"].where(table["empty_case"] == "none")  # miss -> NaN, then nanmean
        dropped.append(monai_like.mean())
    assert all(b >= a for a, b in zip(ours, ours[1:])), ours
    assert all(b < a for a, b in zip(dropped[:-1], dropped[1:-1])), dropped  # the failure we avoid


def test_summary_counts_nan_and_policy_rows():
    """Rows: a measured pair (HD95 4), a both-empty pair (NaN, excluded) and a miss (penalty): image mean
    = (4 + 90.51)/2, n_used 2, n_nan 1, n_policy 1. Pooled lesion sensitivity (any overlap): 1 of 2
    reference lesions -> 0.5; pooled precision 1/1."""
    pred, ref = _hd95_4_pair()
    empty = np.zeros_like(pred)
    table = pd.DataFrame([compute_image_metrics(pred, ref), compute_image_metrics(empty, empty),
                          compute_image_metrics(empty, ref)]).assign(class_id=1)
    s = summarize_metrics(table).set_index(["metric", "aggregation"])
    row = s.loc[("hd95", "image_mean")]
    assert row["value"] == pytest.approx((4 + DIAG_64) / 2)
    assert (row["n_used"], row["n_nan"], row["n_policy"], row["n_rows"]) == (2, 1, 1, 3)
    assert s.loc[("lesion_any_overlap_sensitivity", "pooled_counts"), "value"] == 0.5
    assert s.loc[("lesion_any_overlap_precision", "pooled_counts"), "value"] == 1.0
    bad = table.assign(hd95=np.inf)
    with pytest.raises(ValueError):
        summarize_metrics(bad)


def _mixed_convention_table() -> pd.DataFrame:
    """Hand-made metrics rows of one class scored under two HD conventions (one real case: HD95 175.43 under
    medpy, 356.18 under MetricsReloaded), with a both-empty row (NaN) and lesion counts."""
    rows = [
        # hd_convention, hd95, assd, nsd, empty_case, lesion any_overlap tp, fn, tp_pred, fp
        ("medpy", 175.43, 20.0, 0.25, "none", 1, 0, 1, 1),
        ("medpy", 10.0, 2.0, 0.75, "none", 0, 1, 0, 0),
        ("metrics_reloaded", 356.18, 20.0, 0.25, "none", 1, 0, 1, 1),
        ("metrics_reloaded", 20.0, 2.0, 0.75, "none", 1, 1, 1, 0),
        ("metrics_reloaded", np.nan, np.nan, np.nan, "both_empty", 0, 0, 0, 0),
    ]
    t = pd.DataFrame(rows, columns=["hd_convention", "hd95", "assd", "nsd_tau1px", "empty_case",
                                    "lesion_any_overlap_tp", "lesion_any_overlap_fn",
                                    "lesion_any_overlap_tp_pred", "lesion_any_overlap_fp"])
    return t.assign(class_id=1, nsd_convention="metrics_reloaded", image_id=[f"i{k}" for k in range(len(t))])


def test_summary_never_averages_two_hd_conventions():
    """Two conventions in one table give two hd95 values, each the mean of its own rows (hand):
    medpy (175.43 + 10) / 2 = 92.715, MetricsReloaded (356.18 + 20) / 2 = 188.09 (NaN row excluded), never the
    mixed (175.43 + 356.18) / 2 = 265.805 of the first case. Every other metric is also split: pooled lesion
    sensitivity medpy 1/2, MetricsReloaded 2/3."""
    table = _mixed_convention_table()
    s = summarize_metrics(table)
    assert list(s.columns[:3]) == ["class_id", "hd_convention", "nsd_convention"]
    hd95 = s[(s["metric"] == "hd95") & (s["aggregation"] == "image_mean")].set_index("hd_convention")
    assert sorted(hd95.index) == ["medpy", "metrics_reloaded"]
    assert hd95.loc["medpy", "value"] == pytest.approx(92.715, abs=1e-12)
    assert hd95.loc["metrics_reloaded", "value"] == pytest.approx(188.09, abs=1e-12)
    assert (hd95.loc["medpy", "n_used"], hd95.loc["metrics_reloaded", "n_used"]) == (2, 2)
    assert hd95.loc["metrics_reloaded", "n_nan"] == 1
    assert not np.isclose(s.loc[s["metric"] == "hd95", "value"], 265.805).any()
    sens = s[s["metric"] == "lesion_any_overlap_sensitivity"].set_index("hd_convention")["value"]
    assert sens["medpy"] == 0.5 and sens["metrics_reloaded"] == pytest.approx(2 / 3)
    nsd = s[s["metric"] == "nsd_tau1px"].set_index("hd_convention")["value"]
    assert (nsd["medpy"], nsd["metrics_reloaded"]) == (0.5, 0.5)
    # naming the convention in ``by`` gives the same split, without a duplicate column
    s2 = summarize_metrics(table, by=("hd_convention",))
    assert list(s2.columns[:2]) == ["hd_convention", "nsd_convention"]
    h2 = s2[s2["metric"] == "hd95"].set_index("hd_convention")["value"]
    assert h2.to_dict() == pytest.approx({"medpy": 92.715, "metrics_reloaded": 188.09})
    # overall summary (no grouping) is still split by convention
    s3 = summarize_metrics(table, by=())
    assert s3[s3["metric"] == "hd95"]["value"].tolist() == pytest.approx([92.715, 188.09])


def test_summary_refuses_distances_of_unknown_convention():
    """Distance or NSD columns without their convention column, or rows with it empty, are refused."""
    table = _mixed_convention_table()
    with pytest.raises(ValueError, match=r"no 'hd_convention' column"):
        summarize_metrics(table.drop(columns="hd_convention"))
    with pytest.raises(ValueError, match=r"no 'nsd_convention' column"):
        summarize_metrics(table.drop(columns="nsd_convention"))
    with pytest.raises(ValueError, match=r"1 row\(s\) with an empty 'hd_convention'"):
        summarize_metrics(table.assign(hd_convention=["medpy", None, "medpy", "medpy", "medpy"]))
    # without distance/NSD columns no convention is needed
    lesion_only = table.drop(columns=["hd_convention", "nsd_convention", "hd95", "assd", "nsd_tau1px"])
    s = summarize_metrics(lesion_only)
    assert "hd_convention" not in s.columns
    assert s.set_index("metric").loc["lesion_any_overlap_sensitivity", "value"] == pytest.approx(3 / 5)


def test_write_metrics_table_round_trip(tmp_path):
    """Two stored predictions, two classes each, spacing (0.5, 0.5) mm on image b. Expected (hand):
    image a: class 1 identical -> HD95 0; class 2 = the HD95-4 pair -> 4 (spacing 1).
    image b: class 1 missed -> penalty sqrt((64*0.5)^2 * 2) = 45.2548; class 2 both empty -> NaN.
    Context columns come from counts.parquet (joined on image_id, class_id) and are placed first."""
    eval_dir = tmp_path / "evaluation" / "best"
    pdir = eval_dir / "predictions"
    pdir.mkdir(parents=True)
    p2, r2 = _hd95_4_pair()
    square = _rect((64, 64), 5, 5, 8, 8)
    empty = np.zeros((64, 64), bool)
    _write_npz(pdir / "a.npz", [square, p2], [square, r2], class_ids=(1, 2))
    _write_npz(pdir / "b.npz", [empty, empty], [square, empty], spacing=(0.5, 0.5), class_ids=(1, 2))
    counts = pd.DataFrame({"image_id": ["a", "a", "b", "b"], "class_id": [1, 2, 1, 2], "tp": [64, 100, 0, 0],
                           "dataset": "toy", "split": "test", "run_id": "r0", "model": "unet",
                           "checkpoint_role": "best", "checkpoint_sha256": "abc", "config_hash": "cfg"})
    counts.to_parquet(eval_dir / "counts.parquet", index=False)

    out = write_metrics_table(eval_dir, MetricsConfig())
    assert out == eval_dir / "metrics.parquet"
    table = pd.read_parquet(out)
    assert list(table.columns[:6]) == ["dataset", "split", "run_id", "model", "checkpoint_role",
                                       "checkpoint_sha256"]
    t = table.set_index(["image_id", "class_id"])
    assert len(t) == 4 and (t["dataset"] == "toy").all()
    assert t.loc[("a", 1), "hd95"] == 0.0 and t.loc[("a", 2), "hd95"] == 4.0
    assert t.loc[("b", 1), "hd95"] == pytest.approx(math.sqrt(2) * 32)
    assert t.loc[("b", 1), "spacing_row"] == 0.5
    assert math.isnan(t.loc[("b", 2), "hd95"]) and t.loc[("b", 2), "empty_case"] == "both_empty"
    assert not any(p.name.startswith(".") for p in eval_dir.iterdir())  # no temporary file left behind

    assert write_run_metrics(tmp_path, MetricsConfig(legacy=True)) == [out]
    legacy_table = pd.read_parquet(out)
    assert len(legacy_table["legacy_dice_curve"].iloc[0]) == 256


def test_table_errors_name_the_file_or_folder(tmp_path):
    """No predictions, an unreadable file, a missing key and mismatched shapes are user errors (MSBError)
    whose message names the folder or file."""
    pdir = tmp_path / "predictions"
    with pytest.raises(MSBError, match="predictions"):
        metrics_table_from_predictions(pdir, MetricsConfig())
    pdir.mkdir()
    with pytest.raises(MSBError, match="predictions"):
        write_metrics_table(tmp_path, MetricsConfig())
    with pytest.raises(MSBError, match="evaluation"):
        write_run_metrics(tmp_path, MetricsConfig())
    (pdir / "broken.npz").write_bytes(b"not a zip file")
    with pytest.raises(MSBError, match="broken.npz"):
        metrics_table_from_predictions(pdir, MetricsConfig())
    (pdir / "broken.npz").unlink()
    np.savez(pdir / "nokey.npz", pred=np.zeros((1, 4, 4), bool), ref=np.zeros((1, 4, 4), bool))
    with pytest.raises(MSBError, match=r"nokey.npz.*class_ids"):
        metrics_table_from_predictions(pdir, MetricsConfig())
    (pdir / "nokey.npz").unlink()
    np.savez(pdir / "shape.npz", pred=np.zeros((1, 4, 4), bool), ref=np.zeros((1, 4, 5), bool),
             spacing=np.ones(2), class_ids=np.ones(1, np.int64))
    with pytest.raises(MSBError, match="shape.npz"):
        metrics_table_from_predictions(pdir, MetricsConfig())


def test_config_validation():
    """``extra='forbid'``, positive unique tolerances, iou threshold in (0, 1], connectivity 4/8."""
    from pydantic import ValidationError

    for bad in ({"nsd_tolerance": [1]}, {"nsd_tolerances": []}, {"nsd_tolerances": [0.0]},
                {"nsd_tolerances": [1.0, 1.0]}, {"lesion_iou_threshold": 0.0}, {"connectivity": 6},
                {"hd_convention": "scipy"}, {"min_lesion_area": -1}):
        with pytest.raises(ValidationError):
            MetricsConfig(**bad)
    assert MetricsConfig().hd_convention == "metrics_reloaded"


def test_summary_splits_boundary_connectivity_and_tau_unit():
    """Two boundary connectivities under one HD convention are two hd95 rows (hand means 3 and 10), never
    their pooled mean 6.5 (distances differ with the erosion neighbourhood)."""
    table = pd.DataFrame({"class_id": [1] * 4, "hd_convention": ["medpy"] * 4, "boundary_connectivity": [4, 4, 8, 8],
                          "nsd_convention": ["medpy"] * 4, "nsd_tolerance_unit": ["px", "px", "mm", "mm"],
                          "hd95": [2.0, 4.0, 9.0, 11.0], "nsd_tau1px": [1.0, 0.5, 0.25, 0.75]})
    s = summarize_metrics(table)
    hd95 = s[s["metric"] == "hd95"].set_index("boundary_connectivity")["value"]
    assert hd95.to_dict() == {4: 3.0, 8: 10.0}
    nsd = s[s["metric"] == "nsd_tau1px"].set_index("nsd_tolerance_unit")["value"]
    assert nsd.to_dict() == {"mm": 0.5, "px": 0.75}
