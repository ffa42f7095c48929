"""Study-level keys: schema, errors that name the file and key, parameter application, shipped study files."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from msb.config.generate import generate_runs, load_study
from msb.config.layering import load_layer
from msb.config.schema import RunConfig
from msb.errors import MSBError
from msb.config.study_spec import apply_params, grid_points, param_distributions, params_to_nested

REPO = Path(__file__).resolve().parents[2]
SHIPPED = ["configs/study.yaml", "configs/studies/kvasir_unet_ci.yaml", "configs/studies/kvasir_unet_cpu.yaml"]


@pytest.mark.parametrize("rel", SHIPPED)
def test_shipped_studies_unchanged_by_study_keys(rel: str, tmp_path: Path):
    """Existing study files stay valid, and declaring the new keys as no-ops gives the same run configs."""
    src = REPO / rel
    runs = generate_runs(src)
    data = load_layer(src).data  # _base_ resolved
    data.update({"search": {"method": "none"}, "final": {"ensemble": True},
                 "configs_root": str(REPO / "configs")})
    copy = tmp_path / "study.yaml"
    copy.write_text(yaml.safe_dump(data))
    again = generate_runs(copy)
    assert [(r.run_id, r.config_hash) for r in runs] == [(r.run_id, r.config_hash) for r in again]
    spec, _ = load_study(src)
    assert spec.search is None and spec.cross_validation is None and spec.final is None


def test_final_sets_evaluation_keys(make_project, tmp_path: Path):
    study = make_project(tmp_path, {"study": "s", "final": {"checkpoint": "both", "test_split": "val"}})
    cfg = generate_runs(study)[0].config
    assert cfg.evaluation.checkpoint == "both" and cfg.evaluation.split == "val"


@pytest.mark.parametrize("block, needle", [
    ({"search": {"methd": "grid"}}, "search.method"),
    ({"cross_validation": {"k": 3, "group_colum": "group"}}, "cross_validation.group_column"),
    ({"final": {"externel": []}}, "final.external"),
])
def test_misspelt_keys_name_file_and_closest_key(make_project, tmp_path: Path, block, needle):
    study = make_project(tmp_path, {"study": "s", **block})
    with pytest.raises(MSBError) as e:
        generate_runs(study)
    msg = str(e.value)
    assert str(study) in msg and f"did you mean '{needle}'" in msg


@pytest.mark.parametrize("search, needle", [
    ({"method": "grid", "params": {"train.optimizer.lr": 0.1}}, "needs a non-empty list"),
    ({"method": "grid", "params": {}}, "needs at least one entry"),
    ({"method": "grid", "params": {"train.optimizer.lr": [0.1]}, "n_trials": 3}, "n_trials is not used"),
    ({"method": "hyperband", "params": {"train.optimizer.lr": [0.1, 0.2]}}, "needs n_trials"),
    ({"method": "hyperband", "n_trials": 3, "params": {"train.optimizer.lr": {"type": "float", "low": 1, "high": 0.1}}},
     "low < high"),
    ({"method": "hyperband", "n_trials": 3, "params": {"train.optimizer.lr": {"type": "float", "low": 0, "high": 1,
                                                                              "log": True}}}, "log scale needs low > 0"),
    ({"method": "grid", "params": {"data.split.seed": [1, 2]}}, "cannot be searched"),
    ({"method": "none", "params": {"train.optimizer.lr": [1]}}, "takes no params"),
])
def test_bad_search_blocks(make_project, tmp_path: Path, search, needle):
    study = make_project(tmp_path, {"study": "s", "search": search})
    with pytest.raises(MSBError) as e:
        generate_runs(study)
    assert needle in str(e.value) and str(study) in str(e.value) and "search" in str(e.value)


def test_grid_points_order():
    """itertools.product order: the last parameter varies fastest."""
    pts = grid_points({"a": [1, 2], "b": ["x", "y", "z"]})
    assert pts == [{"a": 1, "b": "x"}, {"a": 1, "b": "y"}, {"a": 1, "b": "z"},
                   {"a": 2, "b": "x"}, {"a": 2, "b": "y"}, {"a": 2, "b": "z"}]


def test_params_to_nested_and_conflict():
    assert params_to_nested({"train.optimizer.lr": 0.1, "train.epochs": 3}) == \
        {"train": {"epochs": 3, "optimizer": {"lr": 0.1}}}
    with pytest.raises(ValueError, match="contains other searched parameters"):
        params_to_nested({"train.optimizer": {"lr": 1}, "train.optimizer.lr": 0.1})


def test_param_distributions():
    d = param_distributions({"a": [1, [2, 3]], "b": {"type": "int", "low": 1, "high": 4}})
    assert d["a"].type == "categorical" and d["a"].choices == [1, [2, 3]]
    assert d["b"].type == "int" and (d["b"].low, d["b"].high) == (1, 4)
    with pytest.raises(ValueError, match="'c'"):
        param_distributions({"c": 3})


def _cfg() -> RunConfig:
    return RunConfig.model_validate({"data": {"name": "x", "root": "x"}, "model": {"arch": "unet"}})


def test_apply_params_replaces_keys_and_validates():
    cfg = apply_params(_cfg(), {"train.optimizer.lr": 0.01, "model.params.decoder_channels": [8, 8, 8, 8, 8]},
                       "study.yaml", {"train": {"epochs": 3}})
    assert cfg.train.optimizer.lr == 0.01 and cfg.model.params["decoder_channels"] == [8, 8, 8, 8, 8]
    assert cfg.train.epochs == 3 and cfg.train.optimizer.name == "adamw"  # untouched siblings are kept
    with pytest.raises(MSBError) as e:
        apply_params(_cfg(), {"train.optimizer.lrr": 0.01}, "study.yaml")
    assert "study.yaml" in str(e.value) and "train.optimizer.lrr" in str(e.value) and "train.optimizer.lr'" in str(e.value)
    with pytest.raises(MSBError) as e:
        apply_params(_cfg(), {"train.optimizer.lr": -1.0}, "study.yaml")
    assert "train.optimizer.lr" in str(e.value) and "greater than 0" in str(e.value)


@pytest.mark.parametrize("search, needle", [
    ({"method": "grid", "params": {"train.optimzer.lr": [0.1]}}, "did you mean 'train.optimizer'"),
    ({"method": "grid", "params": {"train.optimizer.lr": [0.1, -1.0]}}, "greater than 0"),
    ({"method": "hyperband", "n_trials": 2, "params": {"train.batch_size": {"type": "int", "low": 0, "high": 4}}},
     "train.batch_size"),
])
def test_bad_search_values_fail_before_anything_is_written(make_project, tmp_path: Path, search, needle):
    from msb.study.pipeline import run_study

    study = make_project(tmp_path, {"study": "s", "search": search})
    with pytest.raises(MSBError) as e:
        run_study(study)
    assert needle in str(e.value) and str(study) in str(e.value)
    assert not (tmp_path / "runs").exists() and not (tmp_path / "datasets").exists()


@pytest.mark.parametrize("rel", ["configs/studies/kvasir_unet_grid_cv.yaml",
                                 "configs/studies/synthetic_hyperband_cv.yaml"])
def test_example_studies_validate(rel: str):
    from msb.study.units import study_units

    spec, _ = load_study(REPO / rel)
    assert spec.search is not None and spec.cross_validation is not None and spec.final is not None
    units = study_units(REPO / rel)  # every search value is applied to the run config
    assert len(units) == 1 and len(units[0].spec_hash) == 64
