"""The paper's case study (configs/protocols/msb_case_study_paper.yaml): its image-macro is msb's image-foreground
(a hand-built 2-class case where it differs from msb's image-macro and flips the winner), the model-class merge of
the external set, and the cohort's unavailable architectures excluded while the run plan keeps its size."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from msb.analysis.counts.rules import image_table, rule_values
from msb.analysis.protocol.inputs import annotate_counts
from msb.analysis.protocol.ranking_gic import ranking_sensitivity_gic
from msb.data.schema import ClassSpec
from msb.errors import MSBError
from msb.evaluation.counts import counts_rows

REPO = Path(__file__).resolve().parents[3]

# arch -> image -> class -> (tp, fp, fn)
CASE = {"A": {"i0": {1: (10, 0, 0), 2: (0, 0, 1)}, "i1": {1: (10, 0, 0), 2: (0, 0, 1)}},
        "B": {"i0": {1: (5, 5, 0), 2: (5, 5, 0)}, "i1": {1: (5, 5, 0), 2: (5, 5, 0)}}}


def _counts() -> pd.DataFrame:
    frames = []
    for arch, images in CASE.items():
        ids = sorted(images)
        c = {k: np.zeros((len(ids), 2), np.int64) for k in ("tp", "fp", "fn", "tn", "intersection", "reference",
                                                            "predicted", "union")}
        for i, img in enumerate(ids):
            for j, cls in enumerate((1, 2)):
                c["tp"][i, j], c["fp"][i, j], c["fn"][i, j] = images[img][cls]
        c["tn"] = 100 - c["tp"] - c["fp"] - c["fn"]
        c["intersection"], c["reference"] = c["tp"].copy(), c["tp"] + c["fn"]
        c["predicted"], c["union"] = c["tp"] + c["fp"], c["tp"] + c["fp"] + c["fn"]
        ctx = {"dataset": "neo", "split": "test", "fold": 0, "run_id": f"neo-{arch}-00000000-fold0", "model": arch,
               "checkpoint_role": "best", "checkpoint_sha256": "0" * 64, "config_hash": "0" * 64, "threshold": 0.5,
               "threshold_on": "probability", "split_policy": "kfold(k=2,folds=abcd1234)", "input_size": 64,
               "seed": 0, "variant": "", "test_time_rule": "first"}
        df = counts_rows(ctx, c, image_ids=ids, class_ids=[1, 2], class_names=["neoplastic", "non_neoplastic"],
                         heights=10, widths=10, sources=["s"] * len(ids))
        frames.append(annotate_counts(df, "internal", f"/x/neo-{arch}/neo", "neo"))
    return pd.concat(frames, ignore_index=True)


def _dice(tp, fp, fn):
    return 2 * tp / (2 * tp + fp + fn) if 2 * tp + fp + fn else float("nan")


def test_paper_image_macro_is_image_foreground_and_differs_from_msb_image_macro():
    """By hand: A's per-image pooled Dice is 20/21 on both images (paper image-macro 0.952), its per-class image
    means are 1 and 0 (msb image-macro 0.5); B is 2/3 under every rule. So the paper's I ranks A first, msb's
    image-macro B first; the ranking table's I is image-foreground and its G-vs-I winner is A for both."""
    df = _counts()
    by_hand = {}
    for arch, images in CASE.items():
        fg = np.mean([_dice(*np.sum([images[i][c] for c in (1, 2)], axis=0)) for i in images])
        per_class = [np.nanmean([_dice(*images[i][c]) for i in images]) for c in (1, 2)]
        cm = np.mean([_dice(*np.sum([images[i][c] for i in images], axis=0)) for c in (1, 2)])
        by_hand[arch] = (fg, float(np.mean(per_class)), cm)
        t = image_table(df[df["model"] == arch], arch)
        assert float(rule_values(t, "image-foreground", "dice")[0]) == pytest.approx(fg)
        assert float(rule_values(t, "image-macro", "dice")[0]) == pytest.approx(np.mean(per_class))
        assert float(rule_values(t, "class-macro", "dice")[0]) == pytest.approx(cm)
    assert by_hand["A"][0] == pytest.approx(20 / 21) and by_hand["A"][1] == pytest.approx(0.5)
    assert by_hand["B"][:2] == pytest.approx((2 / 3, 2 / 3))
    tidy = ranking_sensitivity_gic(df).set_index("pair")
    gi = tidy.loc["G vs. I"]
    assert (gi["msb_rule_a"], gi["msb_rule_b"]) == ("global-micro", "image-foreground")
    assert (gi["winner_a"], gi["winner_b"], bool(gi["winner_changed"])) == ("A", "A", False)
    assert tidy.loc["I vs. C", "msb_rule_b"] == "class-macro" and tidy.loc["I vs. C", "winner_b"] == "B"
    alt = ranking_sensitivity_gic(df, i_rule="image-macro").set_index("pair").loc["G vs. I"]
    assert (alt["msb_rule_b"], alt["winner_b"], bool(alt["winner_changed"])) == ("image-macro", "B", True)


def test_model_class_merge_unites_predictions():
    """merge_model_classes {polyp: [neoplastic, non_neoplastic]}: one merged class; a pixel predicted as either
    class is polyp (map_reference_classes over the model channels = pixel-wise OR); bad groups are refused."""
    from msb.evaluation.evaluator import map_reference_classes
    from msb.study.external import resolve_model_merge

    model = [ClassSpec(0, "background", (0,)), ClassSpec(1, "neoplastic", (1,)), ClassSpec(2, "non_neoplastic", (2,))]
    merge, merged = resolve_model_merge({"polyp": ["neoplastic", 2]}, model, "study.yaml")
    assert merge == {1: (1, 2)} and [(c.class_id, c.name) for c in merged] == [(1, "polyp")]
    pred = np.zeros((2, 2, 3), bool)
    pred[0, 0, 0], pred[1, 1, 2], pred[0, 1, 1], pred[1, 1, 1] = True, True, True, True
    union = map_reference_classes(pred, [1, 2], merge, [1])
    assert np.array_equal(union[0], pred[0] | pred[1])
    with pytest.raises(MSBError, match=r"\['non_neoplastic'\] are in no merged class"):
        resolve_model_merge({"polyp": ["neoplastic"]}, model, "study.yaml")
    with pytest.raises(MSBError, match="in two merged classes"):
        resolve_model_merge({"a": [1], "b": [1, 2]}, model, "study.yaml")


PAPER_ARCHS = ["unet_classic", "missformer", "hiformer_b", "segformer_b3", "segnext_l", "vwformer_mit_b3",
               "cenet_pvt_b3", "vwformer_convnext_s", "transnext_t_uper", "internimage_t_uper", "swin_umamba"]


def test_paper_plan_excludes_unavailable_architectures(tmp_path: Path):
    """The paper's study on a copy of configs/: with 2 of its 11 architectures present (stand-in configs of the
    tiny U-Net) the plan has 3 datasets x 2 x 2 sizes = 12 units and 54 exclusions; a config whose adapter is
    not registered is excluded too; with all 11 present: 66 units, 66 x (2 grid points + 5 folds) = 462
    trainings (what `msb generate` prints)."""
    from msb.cli.run import plan_size_line
    from msb.config.generate import generate_runs

    root = tmp_path / "configs"
    shutil.copytree(REPO / "configs", root, ignore=shutil.ignore_patterns("protocols", "studies"))
    study = tmp_path / "paper.yaml"
    data = yaml.safe_load((REPO / "configs" / "protocols" / "msb_case_study_paper.yaml").read_text())
    assert data["architectures"] == PAPER_ARCHS
    study.write_text(yaml.safe_dump({**data, "configs_root": str(root)}))
    stub = (root / "architectures" / "unet_tiny.yaml").read_text()
    for name in PAPER_ARCHS:
        (root / "architectures" / f"{name}.yaml").unlink(missing_ok=True)
    for name in ("unet_classic", "segformer_b3"):
        (root / "architectures" / f"{name}.yaml").write_text(stub)
    (root / "architectures" / "missformer.yaml").write_text("model: {arch: missformer_not_here}\n")
    excluded: list = []
    runs = generate_runs(study, excluded)
    assert len(runs) == 12 and {r.architecture for r in runs} == {"unet_classic", "segformer_b3"}
    assert len(excluded) == 54 and {e["input_size"] for e in excluded} == {256, 512}
    reasons = {e["architecture"]: e["reason"] for e in excluded}
    assert "model.arch 'missformer_not_here'" in reasons["missformer"] and "is not registered" in reasons["missformer"]
    assert "no " in reasons["swin_umamba"] and reasons["swin_umamba"].endswith("swin_umamba.yaml")
    assert {e["unit"] for e in excluded if e["architecture"] == "cenet_pvt_b3" and e["dataset"] == "camus"} == {
        "camus-cenet_pvt_b3-input_size256x256", "camus-cenet_pvt_b3-input_size512x512"}
    for name in PAPER_ARCHS:
        (root / "architectures" / f"{name}.yaml").write_text(stub)
    excluded = []
    runs = generate_runs(study, excluded)
    line = plan_size_line(study, runs, excluded)
    assert re.search(r"run plan: 66 units, 462 trainings \(2 search trial\(s\) \+ 5 fold run\(s\) per unit\); 0 unit",
                     line), line
