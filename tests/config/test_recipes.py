"""``recipe: official`` overlays (configs/architectures/official/) against the controlled default, and the
checklist flag for checkpoints selected on the test split.

Expected values are the official scripts' settings (docs/models.md, "Recipe presets"), e.g. PraNet
``MyTrain.py``: ``--epoch 20`` looped as ``range(1, 20)`` = 19 epochs, batch 16, Adam 1e-4, ``clip_gradient``
0.5, the last snapshot tested; G-CASCADE ``train_polyp.py``: ``--epoch 200`` (199 run), ``--batchsize 4``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from msb.analysis.report.contract import RunInfo, _test_selection_item
from msb.config.generate import generate_runs
from msb.errors import MSBError

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

# arch -> (epochs, batch, bce_weighting, precision, test_time_normalisation, evaluation.checkpoint, selection_split)
OFFICIAL = {
    "pranet": (19, 16, "reference", "fp32", "minmax", "latest", "val"),
    "polyp_pvt": (99, 16, "reference", "fp32", "minmax", "best", "test"),
    "pvt_cascade": (99, 16, "reference", "fp32", "minmax", "best", "test"),
    "g_cascade": (199, 4, "reference", "fp32", "minmax", "best", "test"),
    "sanet": (128, 64, "weighted", "fp16", "none", "latest", "val"),  # apex O2 = fp16; bce_weighting unused
}


def _runs(tmp_path: Path, recipe: str) -> dict:
    study = tmp_path / f"{recipe}.yaml"
    study.write_text(yaml.safe_dump({"study": recipe, "configs_root": str(CONFIGS), "recipe": recipe,
                                     "datasets": ["kvasir_seg"], "architectures": list(OFFICIAL)}))
    return {r.architecture: r.config for r in generate_runs(study)}


def test_official_overlays_set_what_the_scripts_do(tmp_path: Path):
    official, controlled = _runs(tmp_path, "official"), _runs(tmp_path, "controlled")
    for arch, (epochs, batch, bce, precision, norm, role, sel) in OFFICIAL.items():
        o, c = official[arch], controlled[arch]
        got = (o.train.epochs, o.train.batch_size, o.train.loss.bce_weighting, o.train.precision,
               o.evaluation.test_time_normalisation, o.evaluation.checkpoint, o.checkpoint.selection_split)
        assert got == (epochs, batch, bce, precision, norm, role, sel), arch
        assert o.recipe == "official" and o.evaluation.metrics.legacy  # threshold-averaged mDice at test
        # the controlled protocol: validation selection, no min-max, best checkpoint, published weighted BCE
        assert (c.recipe, c.checkpoint.selection_split, c.evaluation.test_time_normalisation,
                c.evaluation.checkpoint, c.evaluation.metrics.legacy) == ("controlled", "val", "none", "best", False)
        if arch != "sanet":
            assert c.train.loss.bce_weighting == "weighted" and o.train.grad_clip.mode == "value"
            assert o.train.grad_clip.max == 0.5 and o.train.multiscale.rates == [0.75, 1.0, 1.25]
    assert official["pranet"].train.optimizer.name == "adam" and official["pranet"].train.scheduler.step_size == 50
    # recipe is part of the hash only when official: controlled run ids stay as they were
    assert "recipe" not in controlled["pranet"].model_dump(mode="json")
    assert official["pranet"].model_dump(mode="json")["recipe"] == "official"


def test_test_selection_needs_the_official_recipe(tmp_path: Path):
    study = tmp_path / "s.yaml"
    study.write_text(yaml.safe_dump({"study": "s", "configs_root": str(CONFIGS), "datasets": ["kvasir_seg"],
                                     "architectures": ["polyp_pvt"],
                                     "overrides": {"checkpoint": {"selection_split": "test"}}}))
    with pytest.raises(MSBError, match=r"s\.yaml.*checkpoint\.selection_split.*leaks the test set.*recipe: "
                                       r"official"):
        generate_runs(study)


def test_official_recipe_without_overlay_is_refused(tmp_path: Path):
    study = tmp_path / "s.yaml"
    study.write_text(yaml.safe_dump({"study": "s", "configs_root": str(CONFIGS), "recipe": "official",
                                     "datasets": ["kvasir_seg"], "architectures": ["unet_r18"]}))
    with pytest.raises(MSBError, match=r"recipe: official needs .*architectures/official/unet_r18\.yaml"):
        generate_runs(study)


def test_checklist_flags_test_selection(tmp_path: Path):
    def run(run_id: str, split: str, recipe: str | None) -> RunInfo:
        cfg = {"recipe": recipe} if recipe else {}
        return RunInfo(tmp_path / run_id, run_id, cfg, None, {}, {"best": {"selection_split": split}}, None)

    ok = _test_selection_item([run("a", "val", None)])
    assert ok.passed and "1 run(s)" in ok.evidence
    bad = _test_selection_item([run("a", "val", None), run("b", "test", "official")])
    assert not bad.passed and bad.evidence.endswith("b (best, recipe: official)")
