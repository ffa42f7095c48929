"""``train.precision`` (issue 19): the old ``amp`` key still read with unchanged config hashes, the resolution per
device, bf16 autocast on CPU, the precision recorded for the manifest, and out-of-memory as one line / an
excluded run."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from msb.config.generate import config_hash, generate_runs
from msb.config.layering import check_keys
from msb.config.schema import RunConfig
from msb.errors import MSBError
from msb.utils.precision import resolve_precision

REPO = Path(__file__).resolve().parents[2]
BASE = {"data": {"name": "x", "root": "y"}, "model": {"arch": "unet"}}


def _cfg(train: dict) -> RunConfig:
    return RunConfig.model_validate({**BASE, "train": train})


def test_quickstart_run_id_is_unchanged():
    """The quickstart's run id (its config hash prefix) as main printed it before train.precision existed."""
    assert generate_runs(REPO / "configs" / "study.yaml")[0].run_id == "synthetic-unet_r18-42ceea5f"


@pytest.mark.parametrize("amp,precision", [("auto", "auto"), ("on", "fp16"), ("off", "fp32")])
def test_old_amp_key_maps_and_keeps_the_hash(amp: str, precision: str):
    old, new = _cfg({"amp": amp}), _cfg({"precision": precision})
    assert old.train.precision == new.train.precision == precision
    assert config_hash(old) == config_hash(new)
    dumped = new.model_dump(mode="json")["train"]
    assert dumped["amp"] == amp and "precision" not in dumped  # the spelling hashed before
    assert RunConfig.model_validate({**BASE, "train": dumped}).train.precision == precision  # config.yaml round trip


def test_bf16_and_new_keys_enter_the_hash_only_when_set():
    plain = _cfg({})
    d = plain.model_dump(mode="json")["train"]
    assert not {"compile", "cudnn_benchmark", "pin_memory", "persistent_workers", "prefetch_factor",
                "nonfinite_patience", "precision"} & set(d)
    bf16 = _cfg({"precision": "bf16"})
    assert bf16.model_dump(mode="json")["train"]["precision"] == "bf16" and "amp" not in bf16.model_dump()["train"]
    assert len({config_hash(plain), config_hash(bf16), config_hash(_cfg({"compile": True}))}) == 3
    assert _cfg({"amp": "auto", "precision": "bf16"}).train.precision == "bf16"  # an old amp: auto layer + bf16
    assert _cfg({"amp": "off", "precision": "auto"}).train.precision == "fp32"  # an old study over global.yaml


def test_amp_and_precision_that_disagree_are_refused():
    with pytest.raises(ValueError, match="train.amp 'off'.*train.precision 'bf16' disagree"):
        _cfg({"amp": "off", "precision": "bf16"})
    check_keys({"train": {"amp": "on"}}, RunConfig, "old.yaml")  # still a known key in config files
    with pytest.raises(MSBError, match="old.yaml: unknown key 'train.ampp'"):
        check_keys({"train": {"ampp": "on"}}, RunConfig, "old.yaml")


def test_resolution_per_device(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    got = {r: resolve_precision(r, cpu) for r in ("auto", "fp32", "fp16", "bf16")}
    assert [(got[r].name, got[r].autocast_dtype, got[r].use_scaler) for r in got] == [
        ("fp32", None, False), ("fp32", None, False), ("fp32", None, False), ("bf16", torch.bfloat16, False)]
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert resolve_precision("auto", cuda).name == "bf16" and not resolve_precision("auto", cuda).use_scaler
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    p = resolve_precision("auto", cuda)
    assert (p.name, p.autocast_dtype, p.use_scaler) == ("fp16", torch.float16, True)
    assert resolve_precision("fp16", cuda).use_scaler and resolve_precision("fp32", cuda).autocast_dtype is None


def test_bf16_autocast_on_cpu_computes_in_bf16():
    """Under bf16 on CPU a convolution returns bfloat16, equal to the fp32 result of the bf16-rounded operands."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(1, 3, 8, 8, generator=g), torch.randn(4, 3, 3, 3, generator=g)
    with resolve_precision("bf16", torch.device("cpu")).context(torch.device("cpu")):
        y = torch.nn.functional.conv2d(x, w)
    ref = torch.nn.functional.conv2d(x.bfloat16().float(), w.bfloat16().float())
    assert y.dtype == torch.bfloat16
    assert torch.allclose(y.float(), ref, rtol=1e-2, atol=2e-2)
    with resolve_precision("fp32", torch.device("cpu")).context(torch.device("cpu")):
        assert torch.nn.functional.conv2d(x, w).dtype == torch.float32


def _project(tmp_path: Path, train: dict) -> Path:
    spec = importlib.util.spec_from_file_location("_study_conftest_prec", REPO / "tests" / "study" / "conftest.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.write_project(tmp_path, {"study": "p", "overrides": {"train": {"epochs": 1, "batch_size": 4, **train}}})


def test_bf16_training_on_cpu_is_recorded(tmp_path: Path):
    """One epoch under ``precision: bf16`` on CPU: finite loss; ``train_runtime.json`` (-> manifest) says bf16
    without a scaler, the global and per-process batch."""
    from msb.data.prepare import ensure_dataset
    from msb.engine.runner import train_run

    run = generate_runs(_project(tmp_path, {"precision": "bf16"}))[0]
    res = train_run(run, tmp_path / "r", ensure_dataset(run.config))
    assert res.finished and torch.isfinite(torch.tensor(res.history[0]["train_loss"]))
    rt = json.loads((tmp_path / "r" / "train_runtime.json").read_text())
    assert (rt["precision"], rt["precision_requested"], rt["grad_scaler"], rt["world_size"],
            rt["per_process_batch"]) == ("bf16", "bf16", False, 1, 4)


def test_out_of_memory_is_one_line_and_an_excluded_run(tmp_path: Path, monkeypatch):
    """``torch.OutOfMemoryError`` in training: the study records the unit as excluded with the one-line reason
    naming architecture, input size, batch and precision; with every unit excluded, one error line."""
    from msb.engine.trainer import Trainer
    from msb.study.pipeline import run_study

    def oom(self, epoch, seed):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(Trainer, "_train_epoch", oom)
    study = _project(tmp_path, {})
    with pytest.raises(MSBError, match="every run was excluded"):
        run_study(study)
    excluded = list((tmp_path / "runs" / "p" / "_study").glob("*/excluded.json"))
    assert len(excluded) == 1
    reason = json.loads(excluded[0].read_text())["reason"]
    assert "out of GPU memory during epoch 1: unet at 32x32 px, batch 4, fp32" in reason
    assert "\n" not in reason
    # the study-level table the resolution analysis reads names the unit, architecture and size
    ex = pd.read_csv(tmp_path / "runs" / "p" / "_study" / "exclusions.csv", keep_default_na=False)
    assert list(ex.columns) == ["unit", "dataset", "architecture", "input_size", "reason"]
    assert ex[["unit", "dataset", "architecture", "input_size"]].values.tolist() == [
        ["synthetic-unet_tiny", "synthetic", "unet_tiny", 32]]
    assert "out of GPU memory during epoch 1" in ex["reason"].iloc[0]
    from msb.analysis.protocol.inputs import _read_excluded

    assert _read_excluded(tmp_path / "runs" / "p").values.tolist() == [["unet_tiny", 32, reason]]
