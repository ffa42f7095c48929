"""BCSS converter: multi-class code masks -> the declared class map, built from tiny files written here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pandas as pd
import pytest
import yaml

from msb.data.converters import CONVERTERS, prepare_dataset
from msb.data.schema import load_prepared_dataset, read_mask
from msb.errors import MSBError

REPO = Path(__file__).resolve().parents[2]
A = "TCGA-A1-A0SK-DX1_xmin45749_ymin25055_MPP-0.2500"
B = "TCGA-A1-A0SK-DX1_xmin50000_ymin30000_MPP-0.2500"  # same patient as A
C = "TCGA-E2-A14R-DX1_xmin1_ymin2_MPP-0.2500"
#: 4x6 code masks: 0 outside ROI, 1 tumour, 2 stroma, 20 dcis, 19 angioinvasion, 9 fat
CODES = {
    A: np.array([[1, 1, 2, 2, 0, 0], [1, 1, 2, 2, 0, 0], [20, 20, 3, 3, 9, 9], [20, 20, 3, 3, 9, 9]], np.uint8),
    B: np.array([[2, 2, 2, 2, 2, 2], [2, 1, 1, 2, 2, 2], [2, 1, 1, 2, 2, 2], [2, 2, 2, 2, 19, 19]], np.uint8),
    C: np.zeros((4, 6), np.uint8) + np.array([[0], [0], [0], [1]], np.uint8),  # 18 of 24 px outside the ROI
}


def _source(tmp: Path, codes: dict[str, np.ndarray] = CODES, images_dir: str = "images") -> Path:
    src = tmp / "bcss_src"
    (src / images_dir).mkdir(parents=True)
    (src / "masks").mkdir()
    for k, (stem, m) in enumerate(codes.items()):
        cv2.imwrite(str(src / images_dir / f"{stem}.png"), np.full(m.shape + (3,), 40 * k + 10, np.uint8))
        cv2.imwrite(str(src / "masks" / f"{stem}.png"), m)
    return src


def _mask(root: Path, stem: str) -> np.ndarray:
    return read_mask(root / "masks" / f"{stem}.png")


def test_binary_tumour_vs_rest_default(tmp_path: Path):
    rep = prepare_dataset("bcss", _source(tmp_path), tmp_path / "out")
    ds = load_prepared_dataset(tmp_path / "out", check_mask_values=True)
    assert [(c.class_id, c.name, c.source_values) for c in ds.classes] == [(0, "background", (0,)),
                                                                          (1, "tumour", (1,))]
    # hand-computed: only code 1 is tumour; dcis (20), stroma, fat, outside-ROI are background
    assert np.array_equal(_mask(tmp_path / "out", A), (CODES[A] == 1).astype(np.uint8))
    assert np.array_equal(_mask(tmp_path / "out", B), (CODES[B] == 1).astype(np.uint8))
    assert rep.n_samples == 3
    assert rep.n_changed_mask_pixels == 4 + 0 + 18  # outside-ROI pixels given the background label
    idx = ds.index.set_index("sample_id")
    assert idx.loc[A, "group"] == idx.loc[B, "group"] == "TCGA-A1-A0SK" and idx.loc[C, "group"] == "TCGA-E2-A14R"
    assert float(idx.loc[C, "outside_roi_fraction"]) == pytest.approx(18 / 24)
    cmap = json.loads((tmp_path / "out" / "bcss_class_map.json").read_text())
    assert cmap["foreground"] == {"tumour": [1]} and cmap["gt_codes"]["20"] == "dcis"
    # images are byte copies
    assert (tmp_path / "out" / "images" / f"{A}.png").read_bytes() == \
        (tmp_path / "bcss_src" / "images" / f"{A}.png").read_bytes()


def test_declared_multiclass_map_and_outside_roi_filter(tmp_path: Path):
    fg = {"tumour": [1, 19, 20], "stroma": [2]}
    prepare_dataset("bcss", _source(tmp_path, images_dir="rgbs_colorNormalized"), tmp_path / "out",
                    foreground=fg, max_outside_roi_fraction=0.5)
    ds = load_prepared_dataset(tmp_path / "out", check_mask_values=True)
    assert [c.name for c in ds.classes] == ["background", "tumour", "stroma"]
    assert sorted(ds.index["sample_id"]) == [A, B]  # C has 75 % outside-ROI pixels > 0.5: dropped
    expected_a = np.array([[1, 1, 2, 2, 0, 0], [1, 1, 2, 2, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0]])
    expected_b = np.array([[2, 2, 2, 2, 2, 2], [2, 1, 1, 2, 2, 2], [2, 1, 1, 2, 2, 2], [2, 2, 2, 2, 1, 1]])
    assert np.array_equal(_mask(tmp_path / "out", A), expected_a)
    assert np.array_equal(_mask(tmp_path / "out", B), expected_b)


@pytest.mark.parametrize("foreground, match", [
    ({"tumour": [0]}, "outside_roi"),
    ({"tumour": [1], "other": [1]}, "code 1"),
    ({"tumour": [22]}, "not a BCSS code"),
    ({"background": [2]}, "reserved"),
    ({}, "non-empty mapping"),
])
def test_bad_class_maps_refused(tmp_path: Path, foreground, match):
    with pytest.raises(MSBError, match=match):
        prepare_dataset("bcss", _source(tmp_path), tmp_path / "out", foreground=foreground)
    assert not (tmp_path / "out").exists()


def test_bad_sources_leave_nothing(tmp_path: Path):
    bad = dict(CODES)
    bad[C] = np.full((4, 6), 30, np.uint8)
    with pytest.raises(MSBError, match=r"value\(s\) \[30\] \(24 px\) are not BCSS codes"):
        prepare_dataset("bcss", _source(tmp_path, bad), tmp_path / "out")
    assert not (tmp_path / "out").exists()
    src = tmp_path / "x"
    src.mkdir()
    (src / "images").mkdir()
    with pytest.raises(MSBError, match="masks/"):
        prepare_dataset("bcss", src, tmp_path / "out")


def test_registered_card_docs_and_cli(tmp_path: Path):
    assert "bcss" in CONVERTERS
    card = yaml.safe_load((REPO / "datasets" / "bcss.yaml").read_text())
    assert card["converter"] == "bcss" and card["official_url"].startswith("https://")
    assert card["citation"] and card["licence"] and card["doi"] == "https://doi.org/10.1093/bioinformatics/btz083"
    assert "`bcss`" in (REPO / "docs" / "datasets.md").read_text()
    src = _source(tmp_path)
    r = subprocess.run([sys.executable, "-m", "msb", "data", "prepare", "bcss", "--source", str(src), "--out",
                        str(tmp_path / "o"), "--option", "foreground={tumour: [1, 20]}"], cwd=REPO,
                       capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert np.array_equal(_mask(tmp_path / "o", A), np.isin(CODES[A], [1, 20]).astype(np.uint8))
    index = pd.read_csv(tmp_path / "o" / "index.csv", dtype=str, keep_default_na=False)
    assert set(index["source"]) == {"bcss"}
