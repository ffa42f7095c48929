"""The generated PraNet-layout collection (converter ``synthetic-pranet``) and the PraNet converter's ``test_sets`` /
``train`` options: counts per split and source checked against the raw folder read back with PIL, refusals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from msb.data.converters import prepare_dataset
from msb.data.converters.pranet import TEST_SETS, convert_pranet
from msb.data.synth_pranet import write_synthetic_pranet
from msb.errors import MSBError


def test_raw_layout_has_the_pranet_folders_and_binary_masks(tmp_path: Path) -> None:
    raw = write_synthetic_pranet(tmp_path / "raw", n_train=3, n_test=2, size=(20, 24), seed=1)
    train = sorted(p.name for p in (raw / "TrainDataset" / "image").iterdir())
    assert train == ["1.png", "2.png", "3.png", "cju0000synth.png", "cju0001synth.png", "cju0002synth.png"]
    assert sorted(p.name for p in (raw / "TestDataset").iterdir()) == sorted(TEST_SETS)
    m = np.asarray(Image.open(raw / "TestDataset" / "CVC-300" / "masks" / "1.png"))
    img = np.asarray(Image.open(raw / "TestDataset" / "CVC-300" / "images" / "1.png"))
    assert m.shape == (20, 24) and img.shape == (20, 24, 3) and set(np.unique(m)) <= {0, 255} and m.any()
    again = write_synthetic_pranet(tmp_path / "raw2", n_train=3, n_test=2, size=(20, 24), seed=1)
    for f in sorted(raw.rglob("*.png")):
        assert f.read_bytes() == (again / f.relative_to(raw)).read_bytes()
    with pytest.raises(MSBError, match="not empty"):
        write_synthetic_pranet(raw)


def test_seen_pool_and_one_unseen_set(tmp_path: Path) -> None:
    prepare_dataset("synthetic-pranet", None, tmp_path / "seen", n_train=5, n_test=3,
                    test_sets=["Kvasir", "CVC-ClinicDB"], val_fraction=0.2)
    idx = pd.read_csv(tmp_path / "seen" / "index.csv", keep_default_na=False)
    by = idx.groupby(["split", "source"]).size().to_dict()
    assert by[("test", "Kvasir")] == 3 and by[("test", "CVC-ClinicDB")] == 3
    assert sum(v for (s, _), v in by.items() if s in ("train", "val")) == 10
    assert by.get(("val", "Kvasir"), 0) + by.get(("val", "CVC-ClinicDB"), 0) == 2
    assert set(idx["source"]) == {"Kvasir", "CVC-ClinicDB"}
    prepare_dataset("synthetic-pranet", None, tmp_path / "etis", n_train=5, n_test=3,
                    test_sets=["ETIS-LaribPolypDB"], train=False)
    e = pd.read_csv(tmp_path / "etis" / "index.csv", keep_default_na=False)
    assert list(e["sample_id"]) == [f"test-ETIS-LaribPolypDB-{i}" for i in (1, 2, 3)] and set(e["split"]) == {"test"}


def test_converter_refuses_unknown_or_absent_test_sets_and_an_empty_selection(tmp_path: Path) -> None:
    raw = write_synthetic_pranet(tmp_path / "raw", n_train=2, n_test=1)
    with pytest.raises(MSBError, match="unknown PraNet test set"):
        convert_pranet(raw, tmp_path / "a", test_sets=["Kvasir-SEG"])
    (raw / "TestDataset" / "CVC-300").rename(tmp_path / "moved")
    with pytest.raises(MSBError, match=r"\['CVC-300'\] not found"):
        convert_pranet(raw, tmp_path / "b", test_sets=["CVC-300"])
    with pytest.raises(MSBError, match="nothing to convert"):
        convert_pranet(raw, tmp_path / "c", test_sets=[], train=False)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists() and not (tmp_path / "c").exists()
