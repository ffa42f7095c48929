"""``configs/architectures/``: one recipe per model; a study mixes them and every run config validates."""

from __future__ import annotations

from pathlib import Path

import yaml

from msb.config.generate import generate_runs
from msb.models import available_architectures

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
ALL = ["unet_r18", "unet_r34", "pranet", "polyp_pvt", "sanet", "pvt_cascade", "g_cascade", "segformer_b0",
       "segformer_b2", "unet_mnv3s", "unet_mnv3s075", "unet_tiny",
       "unet_classic", "segformer_b3", "vwformer_mit_b3", "vwformer_convnext_s", "cenet_pvt_b3",
       "segnext_l", "missformer", "hiformer_b", "swin_umamba",
       "uper_convnext_t", "transnext_t_uper", "internimage_t_uper"]
ALL += ["deeplabv3plus_r50"]  # the generic smp adapter's example


def test_the_recipe_files():
    assert sorted(p.stem for p in (CONFIGS / "architectures").glob("*.yaml")) == sorted(ALL)


def test_a_study_mixes_all_recipes(tmp_path: Path):
    """The papers' recipes survive the layering (values from the papers / reference scripts)."""
    study = tmp_path / "mix.yaml"
    study.write_text(yaml.safe_dump({"study": "mix", "configs_root": str(CONFIGS), "datasets": ["kvasir_seg"],
                                     "architectures": ALL}))
    runs = {r.architecture: r.config for r in generate_runs(study)}
    assert set(runs) == set(ALL)
    assert {c.model.arch for c in runs.values()} == set(available_architectures())  # a recipe for every model
    p = runs["pranet"]
    assert (p.train.optimizer.name, p.train.optimizer.lr, p.train.batch_size) == ("adam", 1e-4, 16)
    assert p.train.multiscale.rates == [0.75, 1.0, 1.25] and p.train.multiscale.step_per_rate
    assert p.train.multiscale.soft_masks and p.train.grad_clip.mode == "value" and p.train.grad_clip.max == 0.5
    assert p.data.input_size == (352, 352) and p.evaluation.test_time_normalisation == "none"
    assert p.checkpoint.selection_split == "val"
    s = runs["sanet"]
    assert s.model.params == {"colour_exchange": True, "pcs": True}
    assert (s.train.optimizer.name, s.train.optimizer.lr, s.train.optimizer.backbone_lr_mult) == ("sgd", 0.4, 0.1)
    assert s.train.scheduler.milestones == [64, 96] and s.train.epochs == 128 and s.train.loss.name == "dice_bce"
    assert s.train.multiscale.sampling == "random" and not s.train.multiscale.soft_masks
    for name in ("polyp_pvt", "pvt_cascade", "g_cascade"):
        c = runs[name]
        assert (c.train.optimizer.name, c.train.optimizer.lr, c.train.optimizer.weight_decay) == ("adamw", 1e-4, 1e-4)
        assert c.train.loss.name == "structure" and c.train.loss.bce_weighting == "weighted"
    g = runs["g_cascade"]
    assert tuple([g.model.params["img_size"]] * 2) == g.data.input_size  # the graph size is baked in
    assert runs["unet_r18"].data.input_size == (128, 128)  # no recipe layer: the dataset's size stays
