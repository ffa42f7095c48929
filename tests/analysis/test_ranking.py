"""Ranking sensitivity: a winner that flips between global-micro and image-macro Dice, rank rules, Spearman.

Two synthetic models on the same 5 images: one large object (reference 1000 px) and four small ones (10 px).

    model "large" (good on large objects): large TP 950 FP 50 FN 50 (Dice 0.95); small: missed (TP 0, FN 10,
        Dice 0 each). global-micro Dice = 2*950 / (2*950 + 50 + 90) = 1900/2040 = 0.9314;
        image-macro Dice = 0.95 / 5 = 0.19.
    model "small" (good on small objects): large TP 500 FP 0 FN 500 (Dice 2/3); small: perfect (Dice 1).
        global-micro Dice = 2*540 / (2*540 + 0 + 500) = 1080/1580 = 0.6835;
        image-macro Dice = (2/3 + 4) / 5 = 0.9333.
So "large" wins under global-micro and "small" under image-macro.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from msb.analysis.counts.aggregate import ALL_RULES, reaggregate
from msb.analysis.stats.ranking import rank_table, ranking_correlations, ranking_sensitivity
from msb.errors import MSBError


def model_counts(model: str, rows: dict[str, tuple[int, int, int]]) -> pd.DataFrame:
    return pd.DataFrame([{"dataset": "d", "split": "test", "fold": -1, "run_id": f"d-{model}", "model": model,
                          "checkpoint_role": "best", "image_id": img, "class_id": 1, "class_name": "lesion",
                          "threshold": 0.5, "threshold_on": "probability", "source": "s", "tp": tp, "fp": fp,
                          "fn": fn} for img, (tp, fp, fn) in rows.items()])


SMALL_IDS = ["s1", "s2", "s3", "s4"]
LARGE = model_counts("large", {"big": (950, 50, 50), **{i: (0, 0, 10) for i in SMALL_IDS}})
SMALL = model_counts("small", {"big": (500, 0, 500), **{i: (10, 0, 0) for i in SMALL_IDS}})


def scores() -> pd.DataFrame:
    t = reaggregate(pd.concat([LARGE, SMALL], ignore_index=True), ["model"], ALL_RULES, ("dice", "iou"))
    return t.rename(columns={"model": "system"})


def test_hand_values_of_the_flip():
    s = scores().set_index(["system", "aggregation", "metric"])["value"]
    assert s[("large", "global-micro", "dice")] == pytest.approx(1900 / 2040)
    assert s[("large", "image-macro", "dice")] == pytest.approx(0.19)
    assert s[("small", "global-micro", "dice")] == pytest.approx(1080 / 1580)
    assert s[("small", "image-macro", "dice")] == pytest.approx((2 / 3 + 4) / 5)


def test_ranking_sensitivity_reports_the_winner_flip():
    sens = ranking_sensitivity(scores()).set_index(["aggregation", "metric"])
    ref = sens.loc[("image-macro", "dice")]
    assert ref["winner"] == "small" and not ref["winner_changed"] and ref["spearman_rho"] == pytest.approx(1.0)
    gm = sens.loc[("global-micro", "dice")]
    assert gm["winner"] == "large" and bool(gm["winner_changed"])
    assert gm["ranking"] == "large > small"
    assert gm["n_rank_changes"] == 2 and gm["spearman_rho"] == pytest.approx(-1.0)
    assert gm["reference"] == "image-macro/dice" and gm["n_systems"] == 2
    # class-macro on one class = global-micro: flipped as well
    assert bool(sens.loc[("class-macro", "dice"), "winner_changed"])
    # with global-micro as the reference, image-macro is the one that flips
    other = ranking_sensitivity(scores(), reference=("global-micro", "dice")).set_index(["aggregation", "metric"])
    assert bool(other.loc[("image-macro", "dice"), "winner_changed"])


def test_rank_table_directions_ties_and_undefined():
    s = pd.DataFrame({"system": ["A", "B", "C", "D"] * 2, "aggregation": "image-macro",
                      "metric": ["dice"] * 4 + ["hd95"] * 4,
                      "value": [0.8, 0.9, 0.8, np.nan, 10.0, 3.0, 3.0, 50.0]})
    r = rank_table(s).set_index(["metric", "system"])["rank"]
    assert [r[("dice", k)] for k in "ABCD"] == [2, 1, 2, 4]       # ties share the smallest rank, NaN last
    assert [r[("hd95", k)] for k in "ABCD"] == [3, 1, 1, 4]       # lower HD95 is better


def test_ranking_correlations_hand_value():
    # rankings (1, 2, 3) and (1, 3, 2): rho = 1 - 6 * 2 / (3 * 8) = 0.5
    s = pd.DataFrame({"system": list("ABC") * 2, "aggregation": ["global-micro"] * 3 + ["image-macro"] * 3,
                      "metric": "dice", "value": [0.9, 0.8, 0.7, 0.9, 0.7, 0.8]})
    c = ranking_correlations(s)
    assert c.loc["global-micro/dice", "image-macro/dice"] == pytest.approx(0.5)
    assert c.loc["image-macro/dice", "image-macro/dice"] == pytest.approx(1.0)


def test_ranking_errors():
    with pytest.raises(MSBError, match="reference ranking image-macro/hd95 not in the score table"):
        ranking_sensitivity(scores(), reference=("image-macro", "hd95"))
    dup = pd.concat([scores(), scores()], ignore_index=True)
    with pytest.raises(MSBError, match="several values for system"):
        rank_table(dup)
    with pytest.raises(MSBError, match=r"columns \['system'\]"):
        rank_table(scores().drop(columns="system"))


def test_compare_systems_reports_the_flip_from_counts():
    from msb.analysis.stats.compare import compare_systems

    comps = compare_systems(pd.concat([LARGE, SMALL], ignore_index=True), system_by="run", n_boot=200)
    assert len(comps) == 1 and comps[0].systems == ("large", "small") and comps[0].n_images == 5
    sens = comps[0].ranking.set_index(["aggregation", "metric"])
    assert sens.loc[("global-micro", "dice"), "winner"] == "large"
    assert sens.loc[("image-macro", "dice"), "winner"] == "small"
    assert bool(sens.loc[("global-micro", "dice"), "winner_changed"])
    diff = comps[0].differences.set_index("aggregation")
    assert diff.loc["global-micro", "difference"] == pytest.approx(1900 / 2040 - 1080 / 1580)
    assert diff.loc["image-macro", "difference"] == pytest.approx(0.19 - (2 / 3 + 4) / 5)
