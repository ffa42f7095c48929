"""Trainer/evaluator options added for the model zoo: multi-scale steps, the colour-exchange hook, backbone lr,
multi-step schedule, min-max test-time normalisation (recorded in the prediction semantics), and the ban on
selecting a checkpoint on the test split."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from msb.config.generate import GeneratedRun, config_hash, generate_runs
from msb.config.schema import RunConfig
from msb.data.cache import build_cache
from msb.data.schema import load_prepared_dataset
from msb.data.synth import make_synthetic_dataset
from msb.data.torch_dataset import SegmentationDataset
from msb.analysis.counts.aggregate import reaggregate
from msb.analysis.counts.counts_io import read_counts
from msb.engine.runner import evaluate_run, train_run
from msb.engine.trainer import Trainer, build_optimizer, build_scheduler
from msb.errors import MSBError
from msb.models.base import Segmentor


@pytest.fixture(scope="module")
def synth_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data") / "synthetic"
    make_synthetic_dataset(root, n_samples=16, size=(32, 32), seed=0)
    return root


def _cfg(tmp_path: Path, root: Path, **train) -> RunConfig:
    return RunConfig.model_validate({
        "study": "t", "run_root": str(tmp_path / "runs"), "random_seed": 1,
        "data": {"name": "synthetic", "root": str(root), "input_size": [32, 32], "cache_dir": str(tmp_path / "c"),
                 "split": {"mode": "random", "val_fraction": 0.25, "test_fraction": 0.25, "seed": 0}},
        "model": {"arch": "unet", "encoder": "resnet18", "params": {"decoder_channels": [16, 8, 8, 8, 8]}},
        "train": {"epochs": 1, "batch_size": 4, "device": "cpu", "grad_clip": {"mode": "none", "max": 0},
                  "augment": {"hflip": 0, "vflip": 0}, **train},
    })


class Tiny(Segmentor):
    """A two-conv model with a 'backbone' that records input sizes and transform calls (not registered)."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Conv2d(4, 1, 1)
        self.sizes: list[tuple[int, int]] = []
        self.transforms = 0

    def forward(self, x):
        if self.training:
            self.sizes.append(tuple(x.shape[-2:]))
        return [self.head(torch.relu(self.backbone(x)))]

    def train_batch_transform(self, x, y, generator, mean, std):
        self.transforms += 1
        return x, y


def _trainer(tmp_path: Path, root: Path, **train) -> tuple[Trainer, Tiny, list[int]]:
    cfg = _cfg(tmp_path, root, **train)
    ds = load_prepared_dataset(root)
    cache = build_cache(ds, (32, 32), cfg.data.cache_dir)
    ids = sorted(ds.index["sample_id"])[:8]  # 8 images, batch 4 -> 2 batches
    train_ds = SegmentationDataset(cache, ids, cfg.data.normalize_mean, cfg.data.normalize_std)
    model = Tiny()
    tr = Trainer(cfg, tmp_path / "run", model, train_ds, train_ds)
    steps = []
    orig = tr.optimizer.step

    def counting_step(*a, **k):
        steps.append(1)
        return orig(*a, **k)

    tr.optimizer.step = counting_step  # type: ignore[method-assign]
    return tr, model, steps


def test_one_step_per_rate(tmp_path: Path, synth_root: Path):
    """Rates 0.5/1/1.5 of 32 px with size_multiple 16 -> 16, 32, 48 px; 2 batches -> 6 optimizer steps, and
    the model's train_batch_transform runs once per batch (before the rescaling)."""
    ms = {"rates": [0.5, 1.0, 1.5], "size_multiple": 16}
    tr, model, steps = _trainer(tmp_path, synth_root, multiscale=ms)
    tr._train_epoch(0, seed=7)
    assert len(steps) == 6 and model.transforms == 2
    assert model.sizes == [(16, 16), (32, 32), (48, 48)] * 2


def test_accumulated_rates_take_one_step(tmp_path: Path, synth_root: Path):
    ms = {"rates": [0.5, 1.0, 1.5], "size_multiple": 16, "step_per_rate": False}
    tr, model, steps = _trainer(tmp_path, synth_root, multiscale=ms)
    tr._train_epoch(0, seed=7)
    assert len(steps) == 2 and len(model.sizes) == 6


def test_no_multiscale_is_one_step_per_batch(tmp_path: Path, synth_root: Path):
    tr, model, steps = _trainer(tmp_path, synth_root)
    tr._train_epoch(0, seed=7)
    assert len(steps) == 2 and model.sizes == [(32, 32)] * 2


def test_backbone_lr_mult_and_multistep(tmp_path: Path, synth_root: Path):
    cfg = _cfg(tmp_path, synth_root, optimizer={"name": "sgd", "lr": 0.4, "backbone_lr_mult": 0.1},
               scheduler={"name": "multistep", "milestones": [2, 3], "gamma": 0.5})
    model = Tiny()
    opt = build_optimizer(model, cfg)
    lrs = sorted(g["lr"] for g in opt.param_groups)
    assert lrs == pytest.approx([0.04, 0.4])
    backbone_group = [g for g in opt.param_groups if g["lr"] == pytest.approx(0.04)][0]
    assert {id(p) for p in backbone_group["params"]} == {id(p) for p in model.backbone.parameters()}
    sched = build_scheduler(opt, cfg)
    seen = []
    for _ in range(4):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx([0.4, 0.4, 0.2, 0.1])
    unet = _cfg(tmp_path, synth_root, optimizer={"backbone_lr_mult": 0.1})
    with pytest.raises(MSBError, match="backbone_lr_mult: architecture 'unet' has no 'backbone' module"):
        build_optimizer(nn.Conv2d(1, 1, 1), unet)


def test_checkpoint_selection_on_test_split_is_refused(tmp_path: Path):
    """In a run config and through the layered study (the error names the file that set the key)."""
    with pytest.raises(ValueError, match="leaks the test set"):
        RunConfig.model_validate({"data": {"name": "d", "root": "r"}, "model": {"arch": "unet"},
                                  "checkpoint": {"selection_split": "Test"}})
    repo_configs = Path(__file__).resolve().parents[2] / "configs"
    study = tmp_path / "s.yaml"
    study.write_text(f"study: s\nconfigs_root: {repo_configs}\ndatasets: [synthetic]\narchitectures: [pranet]\n"
                     f"overrides:\n  checkpoint: {{selection_split: test}}\n")
    with pytest.raises(MSBError, match=r"s\.yaml.*checkpoint\.selection_split.*leaks the test set"):
        generate_runs(study)


def test_minmax_needs_probability_threshold():
    with pytest.raises(ValueError, match="minmax' rescales probabilities"):
        RunConfig.model_validate({"data": {"name": "d", "root": "r"}, "model": {"arch": "unet"},
                                  "evaluation": {"threshold_on": "logit", "threshold": 0.0,
                                                 "test_time_normalisation": "minmax"}})


def test_minmax_evaluation_forces_positives_and_is_recorded(tmp_path: Path, synth_root: Path):
    """After one epoch, evaluate twice: with min-max every test image has a predicted region (the protocol's
    known bias), and ``prediction_semantics.json`` records the normalisation and the test-time rule."""
    ds = load_prepared_dataset(synth_root)
    results = {}
    for mode in ("none", "minmax"):
        cfg = _cfg(tmp_path / mode, synth_root)
        cfg = cfg.model_copy(update={"evaluation": cfg.evaluation.model_copy(
            update={"test_time_normalisation": mode, "compute_metrics": False})})
        cfg = RunConfig.model_validate(cfg.model_dump())
        run = GeneratedRun("r", cfg, config_hash(cfg), "synthetic", "unet")
        run_dir = tmp_path / mode / "r"
        train_run(run, run_dir, ds)
        evaluate_run(run_dir, ["best"], ds)
        sem = json.loads((run_dir / "evaluation" / "best" / "prediction_semantics.json").read_text())
        assert sem["test_time_normalisation"] == mode and sem["test_time_rule"] == "first"
        assert sem["test_time_adjustment"] == "none" and sem["threshold"] == 0.5
        preds = sorted((run_dir / "evaluation" / "best" / "predictions").glob("*.npz"))
        results[mode] = [np.load(p)["pred"].any() for p in preds]
        probs = [np.load(p)["prob"] for p in preds]
        if mode == "minmax":
            assert all(p.max() == 255 and p.min() == 0 for p in probs)
        counts = pd.read_parquet(run_dir / "evaluation" / "best" / "counts.parquet")
        assert set(counts["threshold_on"]) == {"minmax_probability" if mode == "minmax" else "probability"}
    assert all(results["minmax"])
    # the two semantics must never be pooled into one score
    both = pd.concat([read_counts([tmp_path / m / "r" / "evaluation" / "best" / "counts.parquet"]).assign(run_id=m)
                      for m in ("none", "minmax")], ignore_index=True)
    with pytest.raises(MSBError, match="threshold_on"):
        reaggregate(both, group_by=("dataset", "split", "model", "checkpoint_role"))
