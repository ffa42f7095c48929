"""Training strategies (msb/engine/strategies): the EMA step, the ramp-up, CPS pseudo-labels, no unlabelled mask
reaching a loss, resume equality under full_determinism, and the two-prediction test-time rule."""

from __future__ import annotations

import json
import math
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from msb.config.generate import GeneratedRun, config_hash
from msb.config.schema import RunConfig
from msb.data.cache import CachedArrays
from msb.data.schema import load_prepared_dataset
from msb.data.synth import make_synthetic_dataset
from msb.data.torch_dataset import SegmentationDataset, UnlabelledImageDataset, build_augmentation
from msb.engine.runner import evaluate_run, train_run
from msb.engine.strategies.cps import pseudo_labels
from msb.engine.strategies.mean_teacher import ema_update, rampup_weight
from msb.engine.trainer import Trainer
from msb.errors import MSBError
from msb.models.registry import build_model
from msb.models.two_prediction import combine_probabilities

NETS = textwrap.dedent('''
    from torch import nn


    class Tiny(nn.Module):
        """conv-BN-ReLU-conv: one logit map (N, C, H, W); BatchNorm so that buffers are averaged too."""

        size_divisor = 4

        def __init__(self, num_classes: int, width: int = 4):
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
                                      nn.Conv2d(width, num_classes, 1))

        def forward(self, x):
            return self.body(x)
''')


@pytest.fixture(scope="module")
def tiny_pkg(tmp_path_factory):
    src = tmp_path_factory.mktemp("user") / "msb_test_tiny_nets"
    src.mkdir()
    (src / "__init__.py").write_text(NETS)
    sys.path.insert(0, str(src.parent))
    yield
    sys.path.remove(str(src.parent))
    sys.modules.pop("msb_test_tiny_nets", None)


@pytest.fixture(scope="module")
def synth_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data") / "synthetic"
    make_synthetic_dataset(root, n_samples=20, size=(16, 16), seed=0)
    return root


def _cfg(tmp_path: Path, root: Path, strategy: dict, epochs: int = 2, **evaluation) -> RunConfig:
    return RunConfig.model_validate({
        "study": "t", "run_root": str(tmp_path / "runs"), "random_seed": 5, "full_determinism": True,
        "data": {"name": "synthetic", "root": str(root), "input_size": [16, 16], "labelled_fraction": 0.3,
                 "split": {"mode": "random", "val_fraction": 0.2, "test_fraction": 0.2, "seed": 0},
                 "cache_dir": str(tmp_path / "cache")},
        "model": {"arch": "tiny", "target": "msb_test_tiny_nets:Tiny"},
        "train": {"epochs": epochs, "batch_size": 2, "augment": {"hflip": 0.5, "vflip": 0.5},
                  "scheduler": {"name": "cosine"}, "device": "cpu", "strategy": strategy},
        "evaluation": {"compute_metrics": False, **evaluation},
        "checkpoint": {"keep_resume_state": True},  # the tests compare the full final resume states
    })


def _run(cfg: RunConfig) -> GeneratedRun:
    return GeneratedRun("run", cfg, config_hash(cfg), "synthetic", "tiny")


# --- formulas by hand ------------------------------------------------------------------------------------------
def test_ema_update_equals_a_hand_computed_step():
    """θ' <- α θ' + (1 − α) θ on a 2-parameter module (weight, bias of Linear(1, 1)), α = 0.9:
    weight 0.9·1 + 0.1·3 = 1.2, bias 0.9·2 + 0.1·(−1) = 1.7; a second step from there: 0.9·1.2 + 0.1·3 = 1.38."""
    teacher, student = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)
    with torch.no_grad():
        teacher.weight.fill_(1.0), teacher.bias.fill_(2.0)
        student.weight.fill_(3.0), student.bias.fill_(-1.0)
    ema_update(teacher, student, 0.9)
    assert teacher.weight.item() == pytest.approx(1.2, abs=1e-6)
    assert teacher.bias.item() == pytest.approx(1.7, abs=1e-6)
    assert student.weight.item() == 3.0 and student.bias.item() == -1.0  # the student is not touched
    ema_update(teacher, student, 0.9)
    assert teacher.weight.item() == pytest.approx(1.38, abs=1e-6)


def test_rampup_weight_at_three_positions():
    """w = 2 · exp(−5 (1 − t)²) over 10 iterations: t = 0 -> 2·e^−5 = 0.0134759; t = 0.5 -> 2·e^−1.25 =
    0.5730096; t = 1 (and beyond) -> 2; no ramp-up (0 iterations) -> 2."""
    assert rampup_weight(0, 10, 2.0) == pytest.approx(0.013475894, abs=1e-8)
    assert rampup_weight(5, 10, 2.0) == pytest.approx(0.573009593, abs=1e-8)
    assert rampup_weight(10, 10, 2.0) == 2.0 and rampup_weight(25, 10, 2.0) == 2.0
    assert rampup_weight(0, 0, 2.0) == 2.0


def test_cps_pseudo_labels_equal_the_other_networks_argmax(tiny_pkg):
    """On a fixed input, the pseudo-labels of a network are the argmax over {background, foreground} of its
    sigmoid probabilities, i.e. [p > 0.5]."""
    from msb_test_tiny_nets import Tiny

    torch.manual_seed(0)
    net = Tiny(2).eval()
    x = torch.randn(3, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = net(x)
    p = torch.sigmoid(logits)
    argmax = torch.stack([1 - p, p]).argmax(0).float()
    pl = pseudo_labels(logits)
    assert torch.equal(pl, argmax)
    assert 0 < float(pl.mean()) < 1  # both labels occur: not true by construction
    assert not pl.requires_grad


def test_two_prediction_average_is_the_mean_of_the_probability_maps():
    la = torch.tensor([[-2.0, 0.0], [1.0, 3.0]])
    lb = torch.tensor([[0.5, -1.0], [4.0, -3.0]])
    prob, logit = combine_probabilities([la, lb])
    expected = (1 / (1 + np.exp(-la.numpy())) + 1 / (1 + np.exp(-lb.numpy()))) / 2
    np.testing.assert_allclose(prob.numpy(), expected, atol=1e-7)
    np.testing.assert_allclose(torch.sigmoid(logit).numpy(), expected, atol=1e-6)
    one_p, one_l = combine_probabilities([la])
    assert torch.equal(one_p, torch.sigmoid(la)) and one_l is la


def test_config_keys_and_errors(tmp_path: Path):
    base = {"data": {"name": "x", "root": "y"}, "model": {"arch": "unet"}}
    plain = RunConfig.model_validate(base).model_dump()
    assert "strategy" not in plain["train"] and "two_prediction" not in plain["evaluation"]  # hashes unchanged
    with pytest.raises(ValueError, match="data.labelled_fraction"):
        RunConfig.model_validate({**base, "train": {"strategy": {"name": "mean_teacher"}}})
    with pytest.raises(ValueError, match="valid: average, student, teacher"):
        RunConfig.model_validate({"data": {"name": "x", "root": "y", "labelled_fraction": 0.1},
                                  "model": {"arch": "unet"}, "train": {"strategy": {"name": "mean_teacher"}},
                                  "evaluation": {"two_prediction": "b"}})
    with pytest.raises(ValueError, match="remove the key"):
        RunConfig.model_validate({**base, "evaluation": {"two_prediction": "average"}})


# --- no unlabelled mask reaches a loss ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["mean_teacher", "cps"])
def test_no_unlabelled_mask_reaches_the_loss(tmp_path: Path, tiny_pkg, monkeypatch, name):
    """The masks of the unlabelled rows are 7s (a value no real mask has); one epoch of training: every target
    the losses see is in {0, 1}, and every unlabelled batch the strategy gets is an image tensor from a dataset
    item with the keys {image, index} only."""
    import msb.engine.strategies.cps as cps_mod
    import msb.engine.strategies.mean_teacher as mt_mod

    rng = np.random.default_rng(0)
    n, lab_n = 10, 4
    masks = (rng.random((n, 1, 8, 8)) > 0.5).astype(np.uint8)
    masks[lab_n:] = 7  # sentinel: rows 4..9 are unlabelled
    ids = [f"s{i}" for i in range(n)]
    cache = CachedArrays(rng.integers(0, 255, (n, 8, 8, 3), dtype=np.uint8), masks, ids, tmp_path)
    aug = build_augmentation(0.5, 0.5, seed=0)
    lab_ds = SegmentationDataset(cache, ids[:lab_n], (0.5,) * 3, (0.25,) * 3, aug)
    unl_ds = UnlabelledImageDataset(cache, ids[lab_n:], (0.5,) * 3, (0.25,) * 3, build_augmentation(0.5, 0.5, seed=0))
    assert (np.asarray(cache.masks[cache.row_of["s5"]]) == 7).all()  # the sentinel is there to be seen
    cfg = RunConfig.model_validate({
        "data": {"name": "x", "root": str(tmp_path), "labelled_fraction": 0.4, "input_size": [8, 8]},
        "model": {"arch": "tiny", "target": "msb_test_tiny_nets:Tiny"},
        "train": {"device": "cpu", "batch_size": 2, "strategy": {"name": name, "unlabelled_ratio": 2,
                                                                 "iterations_per_epoch": 3}}})
    seen: list[float] = []
    real = mt_mod.multi_output_loss

    def spy(outputs, target, *a, **k):
        seen.extend(np.unique(target.numpy()).tolist())
        return real(outputs, target, *a, **k)

    monkeypatch.setattr(mt_mod, "multi_output_loss", spy)
    monkeypatch.setattr(cps_mod, "multi_output_loss", spy)
    keys: list[set] = []
    get = UnlabelledImageDataset.__getitem__
    monkeypatch.setattr(UnlabelledImageDataset, "__getitem__", lambda self, k: keys.append(set(get(self, k))) or get(self, k))
    torch.manual_seed(0)
    t = Trainer(cfg, tmp_path / "run", build_model(cfg.model, 1), lab_ds, lab_ds, unlabelled_ds=unl_ds)
    calls = []
    loss = t.strategy.loss
    monkeypatch.setattr(t.strategy, "loss", lambda x, y, xu, g: calls.append((y.clone(), xu.shape)) or loss(x, y, xu, g))
    t._train_epoch(1, 123)
    assert len(calls) == 3 and all(shape[0] == 4 for _, shape in calls)  # ratio 2 x batch 2 unlabelled images
    assert set(seen) <= {0.0, 1.0} and seen
    assert all(set(np.unique(y.numpy())) <= {0.0, 1.0} for y, _ in calls)
    assert keys and all(k == {"image", "index"} for k in keys)


# --- resume equality under full_determinism ----------------------------------------------------------------------
def _weights(state: dict, key: str) -> dict:
    return state[key] if key == "model" else state["strategy"][key]


@pytest.mark.parametrize("name,other", [("mean_teacher", "teacher"), ("cps", "model_b")])
def test_resume_equality(tmp_path: Path, synth_root: Path, tiny_pkg, name, other):
    """2 epochs straight == 1 epoch, interrupt, resume, 1 epoch: bitwise equal networks, EMA state / second
    network, optimizers and the iteration count (ramp-up position)."""
    strategy = {"name": name, "unlabelled_ratio": 2, "iterations_per_epoch": 3, "rampup_iterations": 4}
    ds = load_prepared_dataset(synth_root)
    full = _cfg(tmp_path / "a", synth_root, strategy)
    res = train_run(_run(full), tmp_path / "a" / "run", ds)
    assert res.finished and res.epochs_done == 2
    part = _cfg(tmp_path / "b", synth_root, strategy)
    assert not train_run(_run(part), tmp_path / "b" / "run", ds, stop_after_epoch=1).finished
    assert train_run(_run(part), tmp_path / "b" / "run", ds).finished
    sa, sb = (torch.load(tmp_path / p / "run" / "state" / "train_state.pt", weights_only=False) for p in "ab")
    assert sa["strategy"]["iteration"] == sb["strategy"]["iteration"] == 6
    for key in ("model", other):
        wa, wb = _weights(sa, key), _weights(sb, key)
        assert wa.keys() == wb.keys()
        for k in wa:
            assert torch.equal(wa[k], wb[k]), (key, k)
    # the second network is a different network (not a copy of the first)
    assert not torch.equal(sa["model"]["net.body.0.weight"], _weights(sa, other)["net.body.0.weight"])
    assert torch.equal(sa["optimizer"]["state"][0]["exp_avg"], sb["optimizer"]["state"][0]["exp_avg"])
    assert [h["train_loss"] for h in sa["history"]] == [h["train_loss"] for h in sb["history"]]
    ckpt = torch.load(tmp_path / "a" / "run" / "checkpoints" / "latest.pt", weights_only=False)
    assert ckpt["strategy"] == name and other in ckpt


# --- the two-prediction rule at evaluation ----------------------------------------------------------------------
def test_mean_teacher_evaluation_records_and_averages(tmp_path: Path, synth_root: Path, tiny_pkg):
    """Evaluating a mean-teacher run under ``average``: the stored probability map is round(255 · mean of the
    student's and the teacher's sigmoid maps), recomputed here from the checkpoint with plain torch; the rule is
    in prediction_semantics.json and in the counts' test_time_rule; the teacher alone gives another column
    value, and pooling the two is refused."""
    from msb.analysis.counts.aggregate import reaggregate
    from msb.data.cache import build_cache
    from msb.data.schema import mask_to_onehot, read_mask
    ds = load_prepared_dataset(synth_root)
    strategy = {"name": "mean_teacher", "iterations_per_epoch": 2, "ema_decay": 0.5}
    cfg = _cfg(tmp_path, synth_root, strategy, epochs=1)
    run_dir = tmp_path / "run"
    train_run(_run(cfg), run_dir, ds)
    counts = pd.read_parquet(evaluate_run(run_dir, ["best"], ds)[0])
    ev = run_dir / "evaluation" / "best"
    sem = json.loads((ev / "prediction_semantics.json").read_text())
    assert sem["test_time_rule"] == "first+mean_teacher:average" and sem["two_prediction"]["rule"] == "average"
    assert set(counts["test_time_rule"]) == {"first+mean_teacher:average"}
    ckpt = torch.load(run_dir / "checkpoints" / "best.pt", weights_only=False)
    nets = []
    for key in ("model", "teacher"):
        net = build_model(cfg.model, 1)
        net.load_state_dict(ckpt[key])
        nets.append(net.eval())
    sid = str(counts["image_id"].iloc[0])
    cache = build_cache(ds, cfg.data.input_size, cfg.data.cache_dir)
    x = SegmentationDataset(cache, [sid], cfg.data.normalize_mean, cfg.data.normalize_std)[0][0][None]
    h, w = mask_to_onehot(read_mask(ds.mask_path(sid)), ds.classes, ds.mask_path(sid)).shape[-2:]
    with torch.no_grad():
        probs = [torch.sigmoid(F.interpolate(n(x)[0], size=(h, w), mode="bilinear", align_corners=False))[0] for n in nets]
    expected = np.round(((probs[0] + probs[1]) / 2).numpy() * 255)
    stored = np.load(ev / "predictions" / f"{sid}.npz")["prob"].astype(float)
    assert np.abs(stored - expected).max() <= 1  # uint8 rounding of float32 sums at most one step apart
    assert not np.array_equal(np.round(probs[0].numpy() * 255), np.round(probs[1].numpy() * 255))

    teacher_dir = tmp_path / "teacher"
    cfg_t = _cfg(teacher_dir, synth_root, strategy, epochs=1, two_prediction="teacher")
    train_run(_run(cfg_t), teacher_dir / "run", ds)
    counts_t = pd.read_parquet(evaluate_run(teacher_dir / "run", ["best"], ds)[0])
    assert set(counts_t["test_time_rule"]) == {"first+mean_teacher:teacher"}
    both = pd.concat([counts, counts_t.assign(run_id="other")], ignore_index=True)
    with pytest.raises(MSBError, match="test_time_rule values"):
        reaggregate(both, group_by=["dataset"])
    assert len(reaggregate(both, group_by=["dataset", "test_time_rule"])) > 0


def test_supervised_with_declared_iterations(tmp_path: Path, synth_root: Path, tiny_pkg):
    """``supervised`` + ``iterations_per_epoch: 3``: 3 optimizer steps per epoch (Adam's step count 6 after 2
    epochs), labelled images only; without the key the trainer's own loop (no ``strategy`` in the resume state)."""
    ds = load_prepared_dataset(synth_root)
    cfg = _cfg(tmp_path, synth_root, {"name": "supervised", "iterations_per_epoch": 3})
    train_run(_run(cfg), tmp_path / "run", ds)
    st = torch.load(tmp_path / "run" / "state" / "train_state.pt", weights_only=False)
    assert st["strategy"] == {"name": "supervised", "iteration": 6}
    assert float(st["optimizer"]["state"][0]["step"]) == 6.0
    plain = _cfg(tmp_path / "p", synth_root, {"name": "supervised"})
    train_run(_run(plain), tmp_path / "p" / "run", ds)
    st = torch.load(tmp_path / "p" / "run" / "state" / "train_state.pt", weights_only=False)
    assert "strategy" not in st
    n_lab = len(pd.read_csv(tmp_path / "p" / "run" / "labelled.csv").query("labelled == 1"))
    assert n_lab >= 2  # batches of 2, a trailing single image dropped (BatchNorm): n_lab // 2 steps an epoch
    assert float(st["optimizer"]["state"][0]["step"]) == 2 * (n_lab // 2)


def _cache_trainer(tmp_path: Path, name: str, **strategy) -> Trainer:
    """A trainer over an in-memory cache of 10 random 8x8 images (4 labelled, 6 unlabelled)."""
    rng = np.random.default_rng(0)
    n, lab_n = 10, 4
    masks = (rng.random((n, 1, 8, 8)) > 0.5).astype(np.uint8)
    ids = [f"s{i}" for i in range(n)]
    cache = CachedArrays(rng.integers(0, 255, (n, 8, 8, 3), dtype=np.uint8), masks, ids, tmp_path)
    lab_ds = SegmentationDataset(cache, ids[:lab_n], (0.5,) * 3, (0.25,) * 3)
    unl_ds = UnlabelledImageDataset(cache, ids[lab_n:], (0.5,) * 3, (0.25,) * 3)
    cfg = RunConfig.model_validate({
        "data": {"name": "x", "root": str(tmp_path), "labelled_fraction": 0.4, "input_size": [8, 8]},
        "model": {"arch": "tiny", "target": "msb_test_tiny_nets:Tiny"},
        "train": {"device": "cpu", "batch_size": 2, "loss": {"name": "bce"}, "strategy": {"name": name, **strategy}}})
    torch.manual_seed(0)
    return Trainer(cfg, tmp_path / "run", build_model(cfg.model, 1), lab_ds, lab_ds, unlabelled_ds=unl_ds)


def test_loss_of_one_iteration_by_hand(tmp_path: Path, tiny_pkg):
    """The strategies' losses against the formulas written out with plain torch on fixed batches (train.loss
    bce = mean BCE with logits): CPS = BCE(a(x), y) + BCE(b(x), y) + λ (BCE(a(u), argmax b) + BCE(b(u), argmax a));
    mean teacher = BCE(s(x), y) + w(i) · mean((σ(s(x·c + b + n)) − σ(t(u)))²), w(3) = 2 e^{−5·0.25}, the strong
    view's draws (c, b per image, then n) repeated from the same seed."""
    from msb.engine.strategies.mean_teacher import strong_view

    g = torch.Generator().manual_seed(3)
    x, xu = torch.randn(2, 3, 8, 8, generator=g), torch.randn(4, 3, 8, 8, generator=g)
    y = (torch.rand(2, 1, 8, 8, generator=g) > 0.5).float()
    bce = F.binary_cross_entropy_with_logits

    t = _cache_trainer(tmp_path / "c", "cps", cps_weight=0.7)
    a, b = t.model, t.strategy.model_b
    with torch.no_grad():
        got = float(t.strategy.loss(x, y, xu, torch.Generator()))
        la, lb = a(xu)[0], b(xu)[0]
        hard = [torch.stack([1 - torch.sigmoid(v), torch.sigmoid(v)]).argmax(0).float() for v in (la, lb)]
        want = float(bce(a(x)[0], y) + bce(b(x)[0], y) + 0.7 * (bce(la, hard[1]) + bce(lb, hard[0])))
    assert got == pytest.approx(want, rel=1e-6)

    t = _cache_trainer(tmp_path / "m", "mean_teacher", consistency_weight=2.0, rampup_iterations=6,
                       strong_noise_std=0.3)
    s, teacher = t.model, t.strategy.teacher
    with torch.no_grad():
        for p in teacher.parameters():  # a teacher different from the student
            p.add_(0.1)
    t.strategy.iteration = 3
    with torch.no_grad():
        got = float(t.strategy.loss(x, y, xu, torch.Generator().manual_seed(9)))
        g2 = torch.Generator().manual_seed(9)
        c = 1 + 0.2 * (2 * torch.rand(4, 1, 1, 1, generator=g2) - 1)
        bb = 0.2 * (2 * torch.rand(4, 1, 1, 1, generator=g2) - 1)
        strong = xu * c + bb + 0.3 * torch.randn(xu.shape, generator=g2)
        assert torch.equal(strong, strong_view(xu, torch.Generator().manual_seed(9), t.cfg.train.strategy))
        want = float(bce(s(x)[0], y)
                     + 2.0 * math.exp(-5 * 0.25) * torch.mean((torch.sigmoid(s(strong)[0])
                                                               - torch.sigmoid(teacher.eval()(xu)[0])) ** 2))
    assert got == pytest.approx(want, rel=1e-6)
