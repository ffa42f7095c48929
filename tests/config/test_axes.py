"""Study axes (one run per combination) and the protocol context every counts row carries."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from msb.analysis.counts.counts_io import read_counts
from msb.config.generate import generate_runs, run_config_to_yaml
from msb.errors import MSBError
from msb.evaluation.counts import COUNTS_COLUMNS, PROTOCOL_DEFAULTS, compute_confusion_counts, counts_rows
from msb.evaluation.protocol_context import protocol_context, split_policy_name, variant_text

from tests.config.test_config import _write, configs  # noqa: F401  (fixture)


def _study(root: Path, **extra) -> Path:
    return _write(root / "studies" / "ax.yaml", {"study": "ax", "datasets": ["toy"], "architectures": ["unet_a"],
                                                 "overrides": {"train": {"epochs": 2}}, **extra})


def test_axes_make_one_run_per_combination(configs: Path):  # noqa: F811
    runs = generate_runs(_study(configs, axes={"data.input_size": [[64, 64], [96, 96]], "random_seed": [0, 1, 2]}))
    assert len(runs) == 6
    got = [(r.config.data.input_size, r.config.random_seed) for r in runs]
    assert got == [((64, 64), 0), ((64, 64), 1), ((64, 64), 2), ((96, 96), 0), ((96, 96), 1), ((96, 96), 2)]
    assert runs[4].config.axes == {"data.input_size": [96, 96], "random_seed": 1}
    assert len({r.run_id for r in runs}) == 6
    # the axes are written into config.yaml (and so into the hash); a study without axes keeps its old dump
    assert yaml.safe_load(run_config_to_yaml(runs[4].config))["axes"] == {"data.input_size": [96, 96],
                                                                           "random_seed": 1}
    plain = generate_runs(_study(configs))[0]
    assert "axes" not in yaml.safe_load(run_config_to_yaml(plain.config))
    # an axis value equal to the plain config gives the same config except for the recorded axes
    assert plain.config.random_seed == 1


def test_axes_errors_name_the_key(configs: Path):  # noqa: F811
    with pytest.raises(MSBError, match=r"axes\.random_seed' has no values"):
        generate_runs(_study(configs, axes={"random_seed": []}))
    with pytest.raises(MSBError, match=r"lists a value twice"):
        generate_runs(_study(configs, axes={"random_seed": [1, 1]}))
    with pytest.raises(MSBError, match=r"input_sise"):
        generate_runs(_study(configs, axes={"data.input_sise": [[64, 64]]}))
    with pytest.raises(MSBError, match=r"not a multiple of"):  # the architecture's divisor, named per axis value
        generate_runs(_study(configs, axes={"data.input_size": [[64, 64], [70, 70]]}))


def test_protocol_context_names(configs: Path, tmp_path: Path):  # noqa: F811
    cfg = generate_runs(_study(configs, axes={"random_seed": [3]}))[0].config
    assert split_policy_name(cfg) == "random(seed=0,val=0.1,test=0.1,group=group)"
    assert split_policy_name(cfg, external=True) == "external-only"
    fixed = cfg.model_copy(update={"data": cfg.data.model_copy(update={"split": cfg.data.split.model_copy(
        update={"mode": "fixed"})})})
    assert split_policy_name(fixed) == "fixed"
    run_dir = tmp_path / "run-fold2"
    run_dir.mkdir()
    (run_dir / "fold.json").write_text('{"fold": 2, "k": 5, "folds_sha256": "abcdef0123456789"}')
    assert split_policy_name(cfg, run_dir) == "kfold(k=5,folds=abcdef01)"
    ctx = protocol_context(cfg, None, "sum")
    assert ctx == {"split_policy": "random(seed=0,val=0.1,test=0.1,group=group)", "input_size": 64, "seed": 3,
                   "variant": "random_seed=3", "test_time_rule": "sum"}
    assert variant_text({"b": [2, 2], "a": 0.5}) == "a=0.5;b=[2,2]"


def test_version_1_counts_read_with_unspecified_protocol(tmp_path: Path):
    pred = ref = pd.DataFrame([[1, 0], [0, 0]]).to_numpy().astype(bool)
    ctx = {"dataset": "d", "split": "test", "fold": -1, "run_id": "r", "model": "m", "checkpoint_role": "best",
           "checkpoint_sha256": "x", "config_hash": "y", "threshold": 0.5, "threshold_on": "probability"}
    df = counts_rows(ctx, compute_confusion_counts(pred[None, None], ref[None, None]), image_ids=["a"],
                     class_ids=[1], class_names=["fg"], heights=2, widths=2)
    assert {c: df[c].iloc[0] for c in PROTOCOL_DEFAULTS} == PROTOCOL_DEFAULTS
    old = df.drop(columns=list(PROTOCOL_DEFAULTS)).assign(schema_version=1)
    path = tmp_path / "counts.parquet"
    pq.write_table(pa.Table.from_pandas(old, preserve_index=False), path)
    back = read_counts(path)
    assert list(back.columns[:len(COUNTS_COLUMNS)]) == list(COUNTS_COLUMNS)
    assert back["split_policy"].tolist() == ["unspecified"] and back["input_size"].tolist() == [-1]
    assert back["tp"].tolist() == [1]


def test_study_units_are_one_per_axis_combination(configs: Path, tmp_path: Path):  # noqa: F811
    from msb.study.units import study_units

    study = _study(configs, axes={"data.input_size": [[64, 64], [96, 96]]})
    names = [u.name for u in study_units(study, run_root=str(tmp_path / "runs"))]
    assert names == ["toy-unet_a-input_size64x64", "toy-unet_a-input_size96x96"]


def _div16_arch(configs: Path, tmp_path: Path, monkeypatch) -> None:
    """Architecture config ``net16``: a user model whose class says size_divisor = 16 (unet_a needs 32)."""
    mod = tmp_path / "mods"
    mod.mkdir()
    (mod / "div16net.py").write_text("import torch\n\nclass Net(torch.nn.Module):\n    size_divisor = 16\n\n"
                                     "    def __init__(self, num_classes=1):\n        super().__init__()\n"
                                     "        self.c = torch.nn.Conv2d(3, num_classes, 1)\n\n"
                                     "    def forward(self, x):\n        return self.c(x)\n")
    monkeypatch.syspath_prepend(str(mod))
    _write(configs / "architectures" / "net16.yaml", {"model": {"arch": "net16", "target": "div16net:Net"}})


def test_a_size_one_architecture_cannot_run_is_an_exclusion(configs: Path, tmp_path: Path, monkeypatch):  # noqa: F811
    """48 px suits the divisor-16 model but not unet_a (32): with an exclusions list the study keeps 3 runs and
    records unet_a at 48 px with the divisor message; without one (msb generate) it still fails."""
    _div16_arch(configs, tmp_path, monkeypatch)
    study = _write(configs / "studies" / "ex.yaml", {"study": "ex", "datasets": ["toy"],
                                                     "architectures": ["unet_a", "net16"],
                                                     "axes": {"data.input_size": [[64, 64], [48, 48]]}})
    excluded: list = []
    runs = generate_runs(study, excluded)
    assert [(r.architecture, r.config.data.input_size) for r in runs] == [
        ("unet_a", (64, 64)), ("net16", (64, 64)), ("net16", (48, 48))]
    assert len(excluded) == 1
    e = excluded[0]
    assert (e["unit"], e["dataset"], e["architecture"], e["input_size"]) == ("toy-unet_a-input_size48x48", "toy",
                                                                              "unet_a", 48)
    assert "48x48 is not a multiple of 32" in e["reason"] and "[64, 64]" in e["reason"]
    with pytest.raises(MSBError, match="not a multiple of 32"):
        generate_runs(study)
    from msb.study.units import study_units

    units = study_units(study, run_root=str(tmp_path / "runs"), exclusions=[])
    assert [u.name for u in units] == ["toy-unet_a-input_size64x64", "toy-net16-input_size64x64",
                                       "toy-net16-input_size48x48"]


def test_a_size_no_architecture_can_run_still_fails(configs: Path):  # noqa: F811
    with pytest.raises(MSBError, match="70x70 is not a multiple of 32"):
        generate_runs(_study(configs, axes={"data.input_size": [[64, 64], [70, 70]]}), [])


def test_baked_input_size_follows_the_axis(configs: Path):  # noqa: F811
    """G-CASCADE's graph size (model.params.img_size) is set from the input-size axis: one run per size."""
    _write(configs / "architectures" / "gc.yaml", {"model": {"arch": "g_cascade", "encoder_weights": "none",
                                                             "params": {"img_size": 352, "k": 11}},
                                                   "data": {"input_size": [352, 352]}})
    study = _write(configs / "studies" / "gc.yaml", {"study": "gc", "datasets": ["toy"], "architectures": ["gc"],
                                                     "axes": {"data.input_size": [[128, 128], [192, 192]]}})
    runs = generate_runs(study)
    assert [r.config.model.params["img_size"] for r in runs] == [[128, 128], [192, 192]]
    assert [r.config.data.input_size for r in runs] == [(128, 128), (192, 192)]
    assert runs[0].config_hash != runs[1].config_hash


def test_architecture_overrides_apply_to_their_architecture_only(configs: Path):  # noqa: F811
    """``architecture_overrides`` merge after ``overrides`` for one architecture's runs (e.g. its own input size),
    leave the other architectures' configs and run ids as without them, and an axis still wins over them."""
    study = configs / "studies" / "arch_over.yaml"
    base = {"study": "ax", "datasets": ["toy"], "architectures": ["unet_a", "unet_b"],
            "overrides": {"train": {"epochs": 2}, "data": {"input_size": [32, 32]}}}
    _write(study, base)
    plain = {r.architecture: r for r in generate_runs(study)}
    _write(study, {**base, "architecture_overrides": {"unet_b": {"data": {"input_size": [128, 128]},
                                                                 "train": {"epochs": 5}}}})
    runs = {r.architecture: r for r in generate_runs(study)}
    assert runs["unet_a"].config.data.input_size == (32, 32) and runs["unet_a"].config.train.epochs == 2
    assert runs["unet_a"].run_id == plain["unet_a"].run_id
    assert runs["unet_b"].config.data.input_size == (128, 128) and runs["unet_b"].config.train.epochs == 5
    assert runs["unet_b"].run_id != plain["unet_b"].run_id
    _write(study, {**base, "architecture_overrides": {"unet_b": {"train": {"epochs": 5}}},
                   "axes": {"train.epochs": [7]}})
    assert {r.architecture: r.config.train.epochs for r in generate_runs(study)} == {"unet_a": 7, "unet_b": 7}
    _write(study, {**base, "architecture_overrides": {"unet_c": {"train": {"epochs": 5}}}})
    with pytest.raises(MSBError, match=r"architecture_overrides' names unet_c, not in the study's architectures"):
        generate_runs(study)
