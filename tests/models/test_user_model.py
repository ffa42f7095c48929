"""A user model from a file outside the package (``model.target: my_user_pkg.nets:TinyNet``) runs a tiny study
end to end, and the entry point group ``msb.models`` registers one by name."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from msb.config.schema import ModelConfig
from msb.errors import MSBError
from msb.models import build_model

REPO = Path(__file__).resolve().parents[2]

USER_CODE = textwrap.dedent('''
    import torch
    from torch import nn


    class TinyNet(nn.Module):
        """Plain nn.Module: one logit map (N, C, H, W); msb wraps it."""

        size_divisor = 4

        def __init__(self, num_classes: int, width: int = 4):
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.ReLU(),
                                      nn.Conv2d(width, num_classes, 1))

        def forward(self, x):
            return self.body(x)


    class TwoHeads(TinyNet):
        test_time_rule = "sum"

        def forward(self, x):
            y = self.body(x)
            return (y, y[:, :, ::2, ::2])
''')


@pytest.fixture()
def user_pkg(tmp_path: Path, monkeypatch) -> Path:
    src = tmp_path / "user_src" / "my_user_pkg"
    src.mkdir(parents=True)
    (src / "__init__.py").write_text("")
    (src / "nets.py").write_text(USER_CODE)
    monkeypatch.syspath_prepend(str(src.parent))
    yield src.parent
    for name in [m for m in sys.modules if m.startswith("my_user_pkg")]:
        del sys.modules[name]


def test_target_wrapped_by_the_adapter(user_pkg: Path):
    m = build_model(ModelConfig(arch="two_heads", target="my_user_pkg.nets:TwoHeads", params={"width": 2}), 1)
    x = torch.randn(2, 3, 8, 8)
    outs = m(x)
    assert isinstance(outs, list) and [tuple(o.shape) for o in outs] == [(2, 1, 8, 8), (2, 1, 4, 4)]
    up = torch.nn.functional.interpolate(outs[1], size=(8, 8), mode="bilinear", align_corners=False)
    assert torch.allclose(m.predict_logits(x), outs[0] + up)  # test_time_rule "sum" read from the class
    assert m.size_divisor == 4 and sum(p.numel() for p in m.parameters()) == 3 * 2 * 9 + 2 + 2 * 1 + 1
    with pytest.raises(MSBError, match=r"model.params: my_user_pkg.nets:TwoHeads does not accept"):
        build_model(ModelConfig(arch="x", target="my_user_pkg.nets:TwoHeads", params={"depth": 3}), 1)
    with pytest.raises(MSBError, match=r"model.target: cannot import module 'no_such_pkg.nets' .*No module named "
                                       r"'no_such_pkg'.*PYTHONPATH"):
        build_model(ModelConfig(arch="x", target="no_such_pkg.nets:Net"), 1)


def test_entry_point_group_registers_a_model(user_pkg: Path, monkeypatch):
    from importlib.metadata import EntryPoint

    import msb.models.registry as registry

    eps = [EntryPoint("tiny_ep", "my_user_pkg.nets:TinyNet", "msb.models")]
    monkeypatch.setattr(registry, "_user_entry_points", lambda: eps)
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    assert "tiny_ep" in registry.available_architectures()
    m = build_model(ModelConfig(arch="tiny_ep"), 2)
    assert tuple(m(torch.zeros(1, 3, 4, 4))[0].shape) == (1, 2, 4, 4)


def test_user_model_runs_a_study(user_pkg: Path, tmp_path: Path):
    from msb.study.pipeline import run_study

    cfg = tmp_path / "configs"
    (cfg / "datasets").mkdir(parents=True)
    (cfg / "architectures").mkdir()
    (cfg / "global.yaml").write_text((REPO / "configs" / "global.yaml").read_text())
    (cfg / "datasets" / "synthetic.yaml").write_text(yaml.safe_dump({"data": {
        "name": "synthetic", "root": str(tmp_path / "datasets" / "synthetic"),
        "prepare": {"converter": "synthetic", "options": {"n_samples": 16, "seed": 0, "size": [32, 32],
                                                          "n_groups": 8}},
        "split": {"mode": "random", "val_fraction": 0.25, "test_fraction": 0.25, "seed": 0, "group_column": "group"},
        "input_size": [32, 32]}}))
    (cfg / "architectures" / "tiny_user.yaml").write_text(yaml.safe_dump(
        {"model": {"arch": "tiny_user", "target": "my_user_pkg.nets:TinyNet", "params": {"width": 4}}}))
    study = cfg / "study.yaml"
    study.write_text(yaml.safe_dump({
        "study": "user", "run_root": str(tmp_path / "runs"), "datasets": ["synthetic"],
        "architectures": ["tiny_user"],
        "overrides": {"train": {"epochs": 1, "batch_size": 4, "device": "cpu"},
                      "evaluation": {"compute_metrics": False}}}))
    torch.set_num_threads(1)
    run_study(study)
    (run,) = [p for p in (tmp_path / "runs" / "user").iterdir() if p.name.startswith("synthetic-tiny_user-")]
    split = pd.read_csv(run / "split.csv")
    n_test = int((split["split"] == "test").sum())
    counts = pd.read_parquet(run / "evaluation" / "best" / "counts.parquet")
    assert len(counts) == n_test > 0 and set(counts["model"]) == {"tiny_user"}
    assert ((counts["tp"] + counts["fp"] + counts["fn"] + counts["tn"]) == 32 * 32).all()
    # the trained weights are the user's module under "net.": they load into the user's own class
    ckpt = torch.load(run / "checkpoints" / "best.pt", map_location="cpu", weights_only=False)
    from my_user_pkg.nets import TinyNet

    net = TinyNet(num_classes=1, width=4)
    net.load_state_dict({k[len("net."):]: v for k, v in ckpt["model"].items()}, strict=True)
    assert json.loads((run / "checkpoints" / "records.json").read_text())["best"]["selection_split"] == "val"
