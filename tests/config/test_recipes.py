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


#: the MSB paper's cohort (issue 32): arch -> what its official overlay sets, read off the official sources named
#: in each overlay's header: (optimizer, lr, momentum or None, weight decay, batch, epochs or None, input size or
#: None, scheduler, precision or None, evaluation.checkpoint or None). None = the overlay leaves the key to the
#: architecture file / study (e.g. the U-Net paper gives no learning rate; iteration budgets are per dataset).
PAPER_OFFICIAL = {
    # ZhifangDeng/MISSFormer train.py / trainer.py: SGD 0.05 m 0.9 wd 1e-4, batch 24, 400 epochs, 224, last epoch
    "missformer": ("sgd", 0.05, 0.9, 1e-4, 24, 400, [224, 224], "cosine", "fp32", "latest"),
    # amirhossein-kz/HiFormer train.py / trainer.py: SGD 0.01 m 0.9 wd 1e-4, batch 10, 401 epochs, 224, last epoch
    "hiformer_b": ("sgd", 0.01, 0.9, 1e-4, 10, 401, [224, 224], "cosine", "fp32", "latest"),
    # SegNeXt segnext.large.512x512.ade.160k.py: AdamW 6e-5 wd 0.01, 4 per GPU x 8 GPUs, 512 crops
    "segnext_l": ("adamw", 6e-5, None, 0.01, 32, None, [512, 512], "cosine", "fp32", "latest"),
    # Swin-UMamba nnUNetTrainerSwinUMamba: AdamW 1e-4 wd 0.05, cosine; batch from the nnU-Net plans
    "swin_umamba": ("adamw", 1e-4, None, 0.05, None, None, None, "cosine", "fp16", "latest"),
    # U-Net (MICCAI 2015, section 3): SGD momentum 0.99, one tile per batch; no lr / decay / schedule given
    "unet_classic": ("sgd", None, 0.99, None, 1, None, None, None, "fp32", None),
    "segformer_b3": ("adamw", 6e-5, None, 0.01, 16, None, None, "none", "fp32", None),
    "vwformer_mit_b3": ("adamw", 6e-5, None, 0.01, 16, None, None, "none", "fp32", None),
    "vwformer_convnext_s": ("adamw", 1e-4, None, 0.05, 16, None, None, "none", "fp16", None),
    "cenet_pvt_b3": ("sgd", 0.01, 0.9, 1e-4, 8, 120, None, "none", "fp16", None),
    "transnext_t_uper": ("adamw", 6e-5, None, 0.05, 16, None, None, "cosine", None, None),
    "internimage_t_uper": ("adamw", 6e-5, None, 0.05, 16, None, None, "cosine", None, None),
}


def test_paper_cohort_official_overlays(tmp_path: Path):
    """All eleven paper architectures generate under both recipes (overlay merged over the architecture file,
    validated by RunConfig); the official run holds the official scripts' values; where the overlay is silent the
    official run equals the controlled one; HiFormer's model is built for the overlay's 224 px."""
    runs = {}
    for recipe in ("controlled", "official"):
        study = tmp_path / f"paper_{recipe}.yaml"
        study.write_text(yaml.safe_dump({"study": f"paper_{recipe}", "configs_root": str(CONFIGS), "recipe": recipe,
                                         "datasets": ["kvasir_seg"], "architectures": sorted(PAPER_OFFICIAL)}))
        runs[recipe] = {r.architecture: r.config for r in generate_runs(study)}
    assert sorted(runs["official"]) == sorted(PAPER_OFFICIAL)
    for arch, (opt, lr, mom, wd, batch, epochs, size, sched, prec, role) in PAPER_OFFICIAL.items():
        o, c = runs["official"][arch], runs["controlled"][arch]
        assert o.recipe == "official" and c.recipe == "controlled" and o.model.arch == c.model.arch == arch
        o_opt, c_opt = o.train.optimizer, c.train.optimizer
        expected = {"optimizer": opt, "lr": lr, "momentum": mom, "weight_decay": wd, "batch": batch, "epochs": epochs,
                    "input_size": size, "scheduler": sched, "precision": prec, "checkpoint": role}
        got = {"optimizer": o_opt.name, "lr": o_opt.lr, "momentum": o_opt.momentum, "weight_decay": o_opt.weight_decay,
               "batch": o.train.batch_size, "epochs": o.train.epochs, "input_size": list(o.data.input_size),
               "scheduler": o.train.scheduler.name, "precision": o.train.precision,
               "checkpoint": o.evaluation.checkpoint}
        controlled = {"optimizer": c_opt.name, "lr": c_opt.lr, "momentum": c_opt.momentum,
                      "weight_decay": c_opt.weight_decay, "batch": c.train.batch_size, "epochs": c.train.epochs,
                      "input_size": list(c.data.input_size), "scheduler": c.train.scheduler.name,
                      "precision": c.train.precision, "checkpoint": c.evaluation.checkpoint}
        for key, value in expected.items():
            if value is None:  # left to the architecture file / study
                assert got[key] == controlled[key], (arch, key)
            elif isinstance(value, float):
                assert got[key] == pytest.approx(value), (arch, key)
            else:
                assert got[key] == value, (arch, key)
        assert o.checkpoint.selection_split == "val" and not o.evaluation.metrics.legacy
    assert runs["official"]["hiformer_b"].model.params["img_size"] == [224, 224]
    assert runs["official"]["swin_umamba"].model.params["deep_supervision"] is True
    assert runs["official"]["swin_umamba"].train.grad_clip.max == 12.0
    assert runs["official"]["unet_classic"].train.optimizer.lr == runs["controlled"]["unet_classic"].train.optimizer.lr
