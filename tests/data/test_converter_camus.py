"""CAMUS converter (msb/data/converters/camus.py) on tiny releases the test writes: NIfTI (nibabel) and the older
MHD/raw layout (SimpleITK); one sample per patient x view x phase, group = patient, labels 0-3 unchanged,
spacing from the headers, Info_*.cfg columns; group-aware folds never split a patient."""

from __future__ import annotations

from pathlib import Path

import cv2
import nibabel as nib
import numpy as np
import pandas as pd
import pytest
import SimpleITK as sitk

from msb.data.converters import prepare_dataset
from msb.data.schema import load_prepared_dataset
from msb.errors import MSBError

H, W = 12, 20  # H != W: a transposed read would change the shape


def _pair(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    img = rng.integers(0, 256, (H, W), dtype=np.uint8)
    gt = np.zeros((H, W), np.uint8)
    gt[2:6, 3:9] = 1
    gt[6:8, 3:9] = 2
    gt[8:11, 12:18] = 3
    gt[0, int(rng.integers(0, W))] = 2
    return img, gt


def _write_nifti(path: Path, arr: np.ndarray, spacing: tuple[float, float]) -> None:
    """``arr`` (rows, cols); NIfTI stores (x, y) = (cols, rows), so the data array is ``arr.T``."""
    nib.save(nib.Nifti1Image(arr.T.copy(), np.diag([spacing[1], spacing[0], 1.0, 1.0])), str(path))


def _write_mhd(path: Path, arr: np.ndarray, spacing: tuple[float, float]) -> None:
    img = sitk.GetImageFromArray(arr)
    img.SetSpacing((spacing[1], spacing[0]))
    sitk.WriteImage(img, str(path))  # .mhd header + .raw data


INFO = "ED: 1\nES: 12\nNbFrame: 12\nSex: {sex}\nAge: 61\nImageQuality: {q}\nEF: 55\nFrameRate: 25\n"


def _release(root: Path, n: int, fmt: str, missing_gt: str | None = None) -> dict:
    rng = np.random.default_rng(3)
    truth = {}
    for k in range(1, n + 1):
        pid = f"patient{k:04d}"
        d = root / pid
        d.mkdir(parents=True)
        for view in ("2CH", "4CH"):
            (d / f"Info_{view}.cfg").write_text(INFO.format(sex="F" if k % 2 else "M", q="Good" if view == "2CH"
                                                            else "Poor"))
            for phase in ("ED", "ES"):
                img, gt = _pair(rng)
                sp = (0.3 + 0.01 * k, 0.2 + 0.01 * k)  # (row, col) mm/px
                stem = f"{pid}_{view}_{phase}"
                if fmt == "nifti":
                    _write_nifti(d / f"{stem}.nii.gz", img, sp)
                    if stem != missing_gt:
                        _write_nifti(d / f"{stem}_gt.nii.gz", gt, sp)
                else:
                    _write_mhd(d / f"{stem}.mhd", img, sp)
                    if stem != missing_gt:
                        _write_mhd(d / f"{stem}_gt.mhd", gt, sp)
                truth[stem] = (img, gt, sp)
    return truth


def _read(path: Path) -> np.ndarray:
    return cv2.imread(str(path), cv2.IMREAD_UNCHANGED)


@pytest.mark.parametrize("fmt", ["nifti", "mhd"])
def test_release_to_prepared_dataset(tmp_path: Path, fmt: str):
    """3 patients x 2 views x 2 phases = 12 samples (one mask missing -> 11); pixels, labels, spacing, groups and
    Info columns as written."""
    src = tmp_path / "raw" / ("CAMUS_public/database_nifti" if fmt == "nifti" else "training")
    truth = _release(src, 3, fmt, missing_gt="patient0002_4CH_ES")
    rep = prepare_dataset("camus", tmp_path / "raw", tmp_path / "out")  # patient folders found 2 levels down
    assert rep.n_samples == 11 and rep.n_changed_mask_pixels == 0
    assert any("patient0002_4CH_ES" in n for n in rep.notes)
    ds = load_prepared_dataset(tmp_path / "out", check_files=True)
    assert [(c.class_id, c.name) for c in ds.classes] == [(0, "background"), (1, "lv_cavity"), (2, "myocardium"),
                                                         (3, "left_atrium")]
    idx = ds.index.set_index("sample_id")
    assert set(idx.index) == set(truth) - {"patient0002_4CH_ES"}
    for sid, (img, gt, sp) in truth.items():
        if sid == "patient0002_4CH_ES":
            continue
        row = idx.loc[sid]
        assert (row["height"], row["width"]) == (H, W)
        assert np.array_equal(_read(ds.root / row["image_path"]), img)
        assert np.array_equal(_read(ds.root / row["mask_path"]), gt)
        assert ds.spacing(sid) == pytest.approx(sp)
        assert row["group"] == sid.split("_")[0] and row["view"] == sid.split("_")[1]
        assert row["phase"] == sid.split("_")[2] and row["source"] == "camus"
    i = pd.read_csv(ds.root / "index.csv", dtype=str, keep_default_na=False).set_index("sample_id")
    assert (i.loc["patient0001_2CH_ED", "image_quality"], i.loc["patient0001_4CH_ES", "image_quality"]) == ("Good",
                                                                                                          "Poor")
    assert (i.loc["patient0002_2CH_ED", "sex"], i.loc["patient0003_2CH_ED", "lv_ef"]) == ("M", "55")


def test_patient_folds_never_split_a_patient(tmp_path: Path):
    """Group-aware 3-fold CV on the converted set (msb.study.folds): each patient's images lie in one fold."""
    from msb.study.folds import assign_folds

    _release(tmp_path / "src", 6, "nifti")
    prepare_dataset("camus", tmp_path / "src", tmp_path / "out")
    ds = load_prepared_dataset(tmp_path / "out")
    folds = assign_folds(ds.index, list(ds.index["sample_id"]), 3, group_column="group", seed=0)
    frame = folds[["sample_id", "fold"]].merge(ds.index[["sample_id", "group"]], on="sample_id")
    assert frame.groupby("group")["fold"].nunique().max() == 1
    assert sorted(frame["fold"].unique()) == [0, 1, 2] and len(frame) == 24


def test_errors(tmp_path: Path):
    """A label outside 0-3, a missing source and an empty folder are one-line MSBErrors; nothing is written."""
    src = tmp_path / "src"
    _release(src, 1, "nifti")
    bad = np.zeros((H, W), np.uint8)
    bad[0, 0] = 5
    _write_nifti(src / "patient0001" / "patient0001_2CH_ED_gt.nii.gz", bad, (0.3, 0.2))
    with pytest.raises(MSBError, match=r"label values \[5\] outside 0-3"):
        prepare_dataset("camus", src, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(MSBError, match="not found"):
        prepare_dataset("camus", tmp_path / "nope", tmp_path / "out")
    (tmp_path / "empty").mkdir()
    with pytest.raises(MSBError, match="no patientNNNN"):
        prepare_dataset("camus", tmp_path / "empty", tmp_path / "out")
