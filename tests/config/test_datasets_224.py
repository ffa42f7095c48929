"""Dataset configs at 224x224 (configs/datasets/*_224.yaml) through the real config layering."""

from __future__ import annotations

from pathlib import Path

import yaml

from msb.config.generate import generate_runs

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

EXPECTED = {  # dataset config -> (data.name, converter, split mode)
    "kvasir_seg_224": ("kvasir_seg", "kvasir-seg", "random"),
    "cvc_clinicdb_224": ("cvc_clinicdb", "cvc-clinicdb", "random"),
    "isic2018_224": ("isic2018", "isic2018-task1", "fixed"),
    "busi_224": ("busi", "busi", "random"),
}


def _study(tmp_path: Path, name: str, datasets: list[str], overrides: dict) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"study": name, "configs_root": str(CONFIGS), "datasets": datasets,
                                    "architectures": ["unet_r18"], "overrides": overrides}))
    return path


def test_224_configs_generate_runs_with_labelled_fraction(tmp_path: Path):
    runs = generate_runs(_study(tmp_path, "semi", list(EXPECTED), {"data": {"labelled_fraction": 0.1}}))
    assert [r.dataset for r in runs] == list(EXPECTED)
    for run in runs:
        name, converter, mode = EXPECTED[run.dataset]
        d = run.config.data
        assert d.input_size == (224, 224)
        assert (d.name, d.prepare.converter, d.split.mode) == (name, converter, mode)
        assert d.labelled_fraction == 0.1 and d.labelled_ids is None


def test_kvasir_224_is_kvasir_seg_with_only_the_size_changed(tmp_path: Path):
    """kvasir_seg_224.yaml inherits kvasir_seg.yaml (``_base_``): the same run config, hence the same hash, as
    kvasir_seg with the input size overridden in the study."""
    a = generate_runs(_study(tmp_path, "s", ["kvasir_seg_224"], {}))[0]
    b = generate_runs(_study(tmp_path, "s", ["kvasir_seg"], {"data": {"input_size": [224, 224]}}))[0]
    c = generate_runs(_study(tmp_path, "s", ["kvasir_seg"], {}))[0]
    assert a.config_hash == b.config_hash
    assert a.config.data.root == c.config.data.root and a.config.data.split == c.config.data.split
    assert c.config.data.input_size == (128, 128) and a.config_hash != c.config_hash
