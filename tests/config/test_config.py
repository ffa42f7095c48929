"""Config layering, validation errors that name file/key/closest key, hashing."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from msb.config.generate import config_hash, generate_runs
from msb.config.layering import deep_merge, load_layer
from msb.errors import MSBError


def _write(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return path


@pytest.fixture
def configs(tmp_path: Path) -> Path:
    root = tmp_path / "configs"
    _write(root / "global.yaml", {"random_seed": 1, "train": {"epochs": 3, "batch_size": 4,
                                                              "optimizer": {"name": "adamw", "lr": 0.01}}})
    _write(root / "datasets" / "toy.yaml", {"data": {"name": "toy", "root": "datasets/toy", "input_size": [64, 64]},
                                            "train": {"batch_size": 2}})
    _write(root / "architectures" / "unet_a.yaml", {"model": {"arch": "unet", "encoder": "resnet18"},
                                                    "train": {"optimizer": {"lr": 0.001}}})
    _write(root / "architectures" / "unet_b.yaml", {"model": {"arch": "unet", "encoder": "resnet34"}})
    _write(root / "studies" / "s.yaml", {"study": "s", "datasets": ["toy"], "architectures": ["unet_a", "unet_b"],
                                         "overrides": {"train": {"epochs": 5}}})
    return root


def test_deep_merge_later_wins_and_lists_replace():
    base = {"a": {"b": 1, "c": [1, 2]}, "d": 1}
    over = {"a": {"c": [3]}, "e": 2}
    assert deep_merge(base, over) == {"a": {"b": 1, "c": [3]}, "d": 1, "e": 2}
    assert base == {"a": {"b": 1, "c": [1, 2]}, "d": 1}  # inputs untouched
    assert deep_merge({"a": {"b": 1, "c": 2}}, {"a": {"_delete_": True, "x": 0}}) == {"a": {"x": 0}}


def test_layers_merge_in_order(configs: Path):
    runs = generate_runs(configs / "studies" / "s.yaml")
    assert [r.architecture for r in runs] == ["unet_a", "unet_b"]
    a, b = runs[0].config, runs[1].config
    assert a.random_seed == 1                      # global
    assert a.train.batch_size == 2                 # dataset over global
    assert a.train.optimizer.lr == 0.001           # architecture over global
    assert a.train.optimizer.name == "adamw"       # deep merge keeps sibling keys
    assert b.train.optimizer.lr == 0.01            # other architecture keeps the global value
    assert a.train.epochs == 5 and b.train.epochs == 5  # study overrides win
    assert a.model.encoder == "resnet18" and b.model.encoder == "resnet34"
    assert runs[0].run_id.startswith("toy-unet_a-") and runs[0].run_id[-8:] == runs[0].config_hash[:8]


def test_hash_is_canonical_and_sensitive(configs: Path):
    r1 = generate_runs(configs / "studies" / "s.yaml")[0]
    r2 = generate_runs(configs / "studies" / "s.yaml")[0]
    assert r1.config_hash == r2.config_hash and len(r1.config_hash) == 64
    changed = r1.config.model_copy(deep=True)
    changed.train.epochs = 6
    assert config_hash(changed) != r1.config_hash
    moved = r1.config.model_copy(update={"run_root": "elsewhere"})
    assert config_hash(moved) == r1.config_hash    # the storage location is not part of the hash


def test_unknown_key_names_file_key_and_closest(configs: Path):
    _write(configs / "architectures" / "unet_a.yaml", {"model": {"arch": "unet", "encodr": "resnet18"}})
    with pytest.raises(MSBError) as e:
        generate_runs(configs / "studies" / "s.yaml")
    msg = str(e.value)
    assert "unet_a.yaml" in msg and "model.encodr" in msg and "did you mean 'model.encoder'" in msg


def test_unknown_key_in_study_overrides(configs: Path):
    _write(configs / "studies" / "s.yaml", {"study": "s", "datasets": ["toy"], "architectures": ["unet_a"],
                                            "overrides": {"train": {"epoch": 5}}})
    with pytest.raises(MSBError) as e:
        generate_runs(configs / "studies" / "s.yaml")
    assert "s.yaml (overrides)" in str(e.value) and "train.epoch" in str(e.value) and "train.epochs" in str(e.value)


def test_bad_value_names_file_and_key(configs: Path):
    _write(configs / "datasets" / "toy.yaml", {"data": {"name": "toy", "root": "x", "input_size": [64, 64]},
                                               "train": {"batch_size": "many"}})
    with pytest.raises(MSBError) as e:
        generate_runs(configs / "studies" / "s.yaml")
    assert "toy.yaml" in str(e.value) and "train.batch_size" in str(e.value)


def test_selection_on_test_split_is_an_error(configs: Path):
    _write(configs / "studies" / "s.yaml", {"study": "s", "datasets": ["toy"], "architectures": ["unet_a"],
                                            "overrides": {"checkpoint": {"selection_split": "test"}}})
    with pytest.raises(MSBError, match="checkpoint.selection_split.*leaks the test set"):
        generate_runs(configs / "studies" / "s.yaml")


def test_missing_layer_and_bad_yaml(configs: Path):
    _write(configs / "studies" / "s.yaml", {"study": "s", "datasets": ["nope"], "architectures": ["unet_a"]})
    with pytest.raises(MSBError, match=r"s\.yaml: unknown dataset 'nope' \(no .*datasets/nope\.yaml\)"
                                       r" available: toy$"):
        generate_runs(configs / "studies" / "s.yaml")
    _write(configs / "studies" / "s.yaml", {"study": "s", "datasets": ["toy"], "architectures": ["unet_c"]})
    with pytest.raises(MSBError, match=r"unknown architecture 'unet_c' .*; did you mean 'unet_b' or 'unet_a'\? "
                                       r"available: unet_a, unet_b$"):  # equal difflib ratios: larger string first
        generate_runs(configs / "studies" / "s.yaml")
    _write(configs / "studies" / "bad.yaml", "study: [unclosed\n")
    with pytest.raises(MSBError, match=r"bad\.yaml: line \d+, column \d+ is not valid YAML"):
        generate_runs(configs / "studies" / "bad.yaml")


def test_base_include_and_cycle(configs: Path):
    _write(configs / "studies" / "child.yaml", {"_base_": "s.yaml", "study": "child",
                                                "overrides": {"train": {"epochs": 7}}})
    runs = generate_runs(configs / "studies" / "child.yaml")
    assert len(runs) == 2 and runs[0].config.study == "child" and runs[0].config.train.epochs == 7
    _write(configs / "studies" / "c1.yaml", {"_base_": "c2.yaml"})
    _write(configs / "studies" / "c2.yaml", {"_base_": "c1.yaml"})
    with pytest.raises(MSBError, match="circular _base_"):
        load_layer(configs / "studies" / "c1.yaml")


def test_shipped_configs_validate(repo_root: Path):
    for study in ["configs/study.yaml", "configs/studies/kvasir_unet_cpu.yaml", "configs/studies/kvasir_unet_ci.yaml"]:
        runs = generate_runs(repo_root / study)
        assert runs and all(len(r.config_hash) == 64 for r in runs)
    # the quickstart compares two architectures under one budget at the synthetic set's native 96 x 96 px
    qs = {r.architecture: r.config for r in generate_runs(repo_root / "configs/study.yaml")}
    assert sorted(qs) == ["segformer_b0", "unet_r18"]
    assert {(c.model.arch, c.model.encoder) for c in qs.values()} == {("unet", "resnet18"), ("segformer", "mit_b0")}
    assert {(tuple(c.data.input_size), c.train.epochs, c.train.batch_size, c.train.optimizer.lr, c.data.name)
            for c in qs.values()} == {((96, 96), 6, 8, 0.002, "synthetic")}
    ci = generate_runs(repo_root / "configs/studies/kvasir_unet_ci.yaml")[0].config
    assert ci.train.epochs == 1 and ci.data.max_samples_per_split == 16 and ci.train.scheduler.name == "cosine"


def test_unknown_architecture_and_bad_input_size_fail_at_generate(configs: Path):
    """Checked when the run config is generated (not at training time), naming the file that set the key."""
    _write(configs / "architectures" / "unet_a.yaml", {"model": {"arch": "unett"}})
    with pytest.raises(MSBError) as e:
        generate_runs(configs / "studies" / "s.yaml")
    assert "unet_a.yaml: key 'model.arch': unknown architecture 'unett'; did you mean 'unet'?" in str(e.value)
    _write(configs / "architectures" / "unet_a.yaml", {"model": {"arch": "unet"}})
    _write(configs / "datasets" / "toy.yaml", {"data": {"name": "toy", "root": "x", "input_size": [100, 100]}})
    with pytest.raises(MSBError) as e:
        generate_runs(configs / "studies" / "s.yaml")
    assert "toy.yaml: key 'data.input_size': 100x100 is not a multiple of 32" in str(e.value)
    assert "[128, 128]" in str(e.value)


def test_threshold_error_names_the_key(configs: Path):
    _write(configs / "studies" / "s.yaml", {"study": "s", "datasets": ["toy"], "architectures": ["unet_a"],
                                            "overrides": {"evaluation": {"threshold": 1.5}}})
    with pytest.raises(MSBError) as e:
        generate_runs(configs / "studies" / "s.yaml")
    assert "s.yaml (overrides): key 'evaluation'" in str(e.value) and "(0, 1)" in str(e.value)


def test_study_outside_configs_finds_the_working_directory_configs(tmp_path, monkeypatch):
    """A study file kept outside any configs tree uses ./configs of the working directory (third rule); the
    nearest global.yaml above the study wins over it; a missing root names both places."""
    from msb.config.generate import find_configs_root, load_study

    project = tmp_path / "project"
    (project / "configs").mkdir(parents=True)
    (project / "configs" / "global.yaml").write_text("random_seed: 0\n")
    elsewhere = tmp_path / "home" / "studies"
    elsewhere.mkdir(parents=True)
    study = elsewhere / "my_study.yaml"
    study.write_text("study: s\ndatasets: [synthetic]\narchitectures: [unet_r18]\n")
    monkeypatch.chdir(project)
    assert find_configs_root(study) == ((project / "configs").resolve(), "./configs of the working directory")
    assert load_study(study)[1] == (project / "configs").resolve()
    (tmp_path / "home" / "global.yaml").write_text("random_seed: 1\n")  # a root above the study wins
    assert find_configs_root(study) == ((tmp_path / "home").resolve(), "nearest folder above the study with global.yaml")
    (tmp_path / "home" / "global.yaml").unlink()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(MSBError, match=r"no configs root found: .* ./configs of the working directory"):
        find_configs_root(study)
