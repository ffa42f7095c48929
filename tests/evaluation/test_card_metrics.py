"""The published card's scoring recipe as written (``msb.evaluation.card_metrics``).

References: the oracle's ``recipe_semigda`` values (``../shared/oracle/reference_values.json``, computed with the
card's literal ``cdist`` code) and the brute-force formula
``np.percentile(np.max(cdist(argwhere(pred), argwhere(gt)), axis=1), 95)`` evaluated here.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.spatial.distance import cdist

from _oracle import case_names, decode, load_case
from msb.config.generate import config_hash
from msb.config.metrics_schema import MetricsConfig
from msb.config.schema import RunConfig
from msb.evaluation import card_metrics as cm
from msb.evaluation.image_metrics import compute_image_metrics, summarize_metrics


def brute_force(pred: np.ndarray, gt: np.ndarray) -> float:
    """The card's line, literally."""
    return float(np.percentile(np.max(cdist(np.argwhere(pred), np.argwhere(gt)), axis=1), 95))


@pytest.mark.parametrize("name", case_names())
def test_equals_oracle_recipe_on_every_case(name):
    pred, gt, _, ref = load_case(name)
    expected = ref["recipe_semigda"]["value"]
    if isinstance(expected, dict):  # the card's code raised: we refuse with a reason instead
        assert "error" in expected
        with pytest.raises(cm.CardRecipeError, match="empty"):
            cm.card_hd95_as_written(pred, gt)
        assert not pred.any() or not gt.any()
        row = cm.card_image_metrics(pred, gt)
        assert math.isnan(row["card_hd95_as_written"]) and "empty" in row["card_hd95_refused"]
    else:
        # the JSON stores 10 decimals
        assert cm.card_hd95_as_written(pred, gt) == pytest.approx(float(expected), abs=1e-9)


@pytest.mark.parametrize("name", case_names())
def test_dice_iou_as_written_equal_oracle_numpy(name):
    """The oracle's numpy Dice/IoU are nan where the denominator is 0, exactly the card's 0/0."""
    pred, gt, _, ref = load_case(name)
    dice, iou = cm.card_dice_iou_as_written(pred, gt)
    for value, key in ((dice, "dice"), (iou, "iou")):
        e = decode(ref["oracle_numpy"][key])
        assert (math.isnan(value) and math.isnan(e)) or value == pytest.approx(e, abs=1e-9)  # 10 decimals stored


def test_equals_brute_force_on_random_masks():
    rng = np.random.default_rng(13)
    for trial in range(40):
        h, w = rng.integers(4, 40, size=2)
        density = rng.uniform(0.02, 0.6)
        pred = rng.random((h, w)) < density
        gt = rng.random((h, w)) < rng.uniform(0.02, 0.6)
        if trial % 4 == 0:  # blob-like shapes too
            gt = np.zeros((h, w), bool)
            r0, c0 = rng.integers(0, h), rng.integers(0, w)
            gt[max(0, r0 - 5):r0 + 5, max(0, c0 - 3):c0 + 7] = True
        pred[0, 0] = gt[-1, -1] = True  # both non-empty
        assert cm.card_hd95_as_written(pred, gt) == brute_force(pred, gt)
        assert np.array_equal(cm.farthest_point_distances(np.argwhere(pred), np.argwhere(gt)),
                              np.max(cdist(np.argwhere(pred), np.argwhere(gt)), axis=1))


@pytest.mark.parametrize("cells", [
    [(5, 5)],                                # one pixel
    [(2, 3), (9, 3)],                        # two pixels
    [(4, c) for c in range(2, 15)],          # horizontal line
    [(r, 7) for r in range(0, 12)],          # vertical line
    [(i, i) for i in range(3, 14)],          # diagonal line
    [(2 * i, 20 - 3 * i) for i in range(6)],  # slanted collinear, gaps
])
def test_degenerate_reference_sets(cells):
    """Collinear / single-pixel references have no 2D hull: the extreme points along the line are used."""
    gt = np.zeros((24, 24), bool)
    for r, c in cells:
        gt[r, c] = True
    pred = np.zeros_like(gt)
    pred[[0, 3, 23, 11], [0, 17, 5, 23]] = True
    assert cm.card_hd95_as_written(pred, gt) == brute_force(pred, gt)
    assert cm.card_hd95_as_written(gt, gt) == brute_force(gt, gt)


def test_identical_disk_is_its_diameter_not_zero():
    """Hand check of what the recipe measures: a perfect prediction of a disk of radius 30 scores about
    the diameter (oracle: 59.08), while every real HD95 is 0."""
    yy, xx = np.mgrid[:224, :224]
    disk = (yy - 112) ** 2 + (xx - 112) ** 2 <= 30 ** 2
    row = compute_image_metrics(disk, disk, config=MetricsConfig(card=True))
    assert row["hd95"] == 0.0
    assert row["card_hd95_as_written"] == brute_force(disk, disk)
    # the oracle's identical_disk_224 value (the same disk); never more than the diameter 2 r = 60
    assert row["card_hd95_as_written"] == pytest.approx(59.076221951, abs=1e-9)
    assert row["card_dice_as_written"] == 1.0 and row["card_iou_as_written"] == 1.0


def test_refuses_empty_masks_with_reason():
    full = np.ones((8, 8), bool)
    empty = np.zeros((8, 8), bool)
    with pytest.raises(cm.CardRecipeError, match="the prediction is empty"):
        cm.card_hd95_as_written(empty, full)
    with pytest.raises(cm.CardRecipeError, match="the reference is empty"):
        cm.card_hd95_as_written(full, empty)
    with pytest.raises(cm.CardRecipeError, match="the prediction and the reference are empty"):
        cm.card_hd95_as_written(empty, empty)
    with pytest.raises(cm.CardRecipeError, match="image b:"):
        cm.card_dataset_scores([(full, full), (empty, full)], ["a", "b"])


def test_dataset_scores_are_the_cards_plain_means():
    a = np.zeros((10, 10), bool)
    a[2:6, 2:6] = True  # 16 px
    b = np.zeros((10, 10), bool)
    b[4:8, 4:8] = True  # 16 px, overlap 4 px
    out = cm.card_dataset_scores([(a, a), (a, b)])
    # Dice: 1 and 2*4/32 = 0.25; IoU: 1 and 4/28
    assert out["dice"] == pytest.approx((1 + 0.25) / 2, abs=1e-15)
    assert out["iou"] == pytest.approx((1 + 4 / 28) / 2, abs=1e-15)
    assert out["hd95"] == pytest.approx((brute_force(a, a) + brute_force(a, b)) / 2, abs=1e-12)
    assert out["n_images"] == 2


def test_card_group_is_opt_in_beside_real_hd95_and_hash_neutral():
    a = np.zeros((16, 16), bool)
    a[3:9, 3:9] = True
    b = np.roll(a, 2, axis=1)
    plain = compute_image_metrics(a, b)
    assert not any(k.startswith("card_") for k in plain)
    row = compute_image_metrics(a, b, config=MetricsConfig(card=True))
    assert row["hd_convention"] == "metrics_reloaded" and row["hd95"] == plain["hd95"]
    assert row["card_hd95_as_written"] == brute_force(a, b)
    import pandas as pd

    summary = summarize_metrics(pd.DataFrame([{"image_id": "x", "class_id": 1, **row}]))
    metrics = set(summary["metric"])
    assert {"hd95", "card_hd95_as_written", "card_dice_as_written"} <= metrics
    assert set(summary["hd_convention"]) == {"metrics_reloaded"}
    # the default (card: false) leaves config.yaml and the run-config hash unchanged
    base = {"data": {"name": "d", "root": "r"}, "model": {"arch": "unet"}}
    cfg = RunConfig.model_validate(base)
    assert "card" not in cfg.model_dump(mode="json")["evaluation"]["metrics"]
    explicit = RunConfig.model_validate({**base, "evaluation": {"metrics": {"card": False}}})
    assert config_hash(explicit) == config_hash(cfg)
    on = RunConfig.model_validate({**base, "evaluation": {"metrics": {"card": True}}})
    assert config_hash(on) != config_hash(cfg)


def test_from_stored_predictions_beside_real_hd95(tmp_path):
    """The opt-in group computed from stored prediction files (the ``msb metrics`` path): one row per image x
    class with the real HD95 and its convention, and the card's values equal to the literal formula."""
    from msb.evaluation.image_metrics import metrics_table_from_predictions

    pred_dir = tmp_path / "predictions"
    pred_dir.mkdir()
    a = np.zeros((1, 20, 20), bool)
    a[0, 4:12, 5:15] = True
    b = np.zeros_like(a)
    b[0, 6:14, 5:15] = True
    for name, p, r in (("img1", a, b), ("img2", b, np.zeros_like(b))):
        np.savez(pred_dir / f"{name}.npz", pred=p, ref=r, spacing=np.array([0.5, 0.5]),
                 class_ids=np.array([1], np.int64))
    table = metrics_table_from_predictions(pred_dir, MetricsConfig(card=True, hd_convention="medpy"))
    one = table.set_index("image_id").loc["img1"]
    assert one["hd_convention"] == "medpy" and one["hd95"] == pytest.approx(1.0)  # 2 px x 0.5 mm
    assert one["card_hd95_as_written"] == brute_force(a[0], b[0])  # pixels: spacing ignored, as the card
    two = table.set_index("image_id").loc["img2"]
    assert math.isnan(two["card_hd95_as_written"]) and "reference is empty" in two["card_hd95_refused"]
    assert two["card_dice_as_written"] == 0.0 and two["hd95"] == two["distance_penalty"]
