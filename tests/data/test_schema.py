"""Prepared-dataset schema: loading, validation errors (naming line/row/file), readers, one-hot conversion."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pandas as pd
import pytest
from PIL import Image

from msb.data.schema import (ClassSpec, PreparedDataset, load_prepared_dataset, mask_to_label_map, mask_to_onehot,
                             read_classes, read_image, read_mask, write_prepared_dataset)
from msb.errors import MSBError

CLASSES = [ClassSpec(0, "background", (0,)), ClassSpec(1, "polyp", (255,))]


def make_dataset(root: Path, n: int = 4, hw: tuple[int, int] = (12, 16)) -> pd.DataFrame:
    """Write ``n`` RGB images + {0,255} masks and the CSVs; return the index written."""
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir(parents=True)
    rows = []
    for i in range(n):
        sid = f"s{i}"
        img = np.full((*hw, 3), 40 * i, np.uint8)
        msk = np.zeros(hw, np.uint8)
        msk[2:5, 3:3 + i + 1] = 255
        cv2.imwrite(str(root / "images" / f"{sid}.png"), img)
        cv2.imwrite(str(root / "masks" / f"{sid}.png"), msk)
        rows.append({"sample_id": sid, "image_path": f"images/{sid}.png", "mask_path": f"masks/{sid}.png",
                     "split": ["train", "val", "test", ""][i % 4], "group": f"g{i // 2}", "height": hw[0],
                     "width": hw[1], "source": "unit"})
    index = pd.DataFrame(rows)
    write_prepared_dataset(root, index, CLASSES)
    return index


def edit_index(root: Path, fn) -> None:
    df = pd.read_csv(root / "index.csv", dtype=str, keep_default_na=False)
    df = fn(df)
    df.to_csv(root / "index.csv", index=False)


def test_load_valid_dataset(tmp_path: Path) -> None:
    make_dataset(tmp_path / "ds")
    ds = load_prepared_dataset(tmp_path / "ds", check_mask_values=True)
    assert isinstance(ds, PreparedDataset)
    assert ds.name == "ds" and len(ds) == 4
    assert ds.sample_ids == ["s0", "s1", "s2", "s3"]
    assert ds.index["height"].dtype == np.int64 and ds.index["height"].tolist() == [12] * 4
    assert ds.index["split"].tolist() == ["train", "val", "test", ""]
    assert [c.class_id for c in ds.foreground_classes] == [1]
    assert ds.image_path("s2") == (tmp_path / "ds" / "images" / "s2.png").resolve()
    assert ds.mask_path("s2").name == "s2.png"
    assert ds.spacing("s1") == (1.0, 1.0)
    onehot = ds.load_onehot("s2")
    assert onehot.shape == (1, 12, 16) and onehot.dtype == bool and int(onehot.sum()) == 9
    img = ds.load_image("s3")
    assert img.shape == (12, 16, 3) and img.dtype == np.uint8 and int(img[0, 0, 0]) == 120
    with pytest.raises(MSBError, match="no sample with sample_id 'nope'"):
        ds.image_path("nope")


def test_spacing_columns(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    make_dataset(root)
    edit_index(root, lambda df: df.assign(spacing_row=["0.5", "", "0.25", "2"], spacing_col=["0.5", "", "0.3", "2"]))
    ds = load_prepared_dataset(root)
    assert ds.spacing("s0") == (0.5, 0.5)
    assert ds.spacing("s1") == (1.0, 1.0)
    assert ds.spacing("s2") == (0.25, 0.3)
    edit_index(root, lambda df: df.assign(spacing_row=["0.5", "-1", "0.25", "2"]))
    with pytest.raises(MSBError, match=r"line 3 \(sample_id 's1'\): spacing_row '-1'"):
        load_prepared_dataset(root)


def test_missing_column(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    make_dataset(root)
    edit_index(root, lambda df: df.drop(columns=["width"]))
    with pytest.raises(MSBError, match=r"missing column\(s\) \['width'\]") as e:
        load_prepared_dataset(root)
    assert str(root / "index.csv") in str(e.value)


def test_duplicate_sample_id(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    make_dataset(root)
    edit_index(root, lambda df: df.assign(sample_id=["s0", "s1", "s0", "s3"]))
    with pytest.raises(MSBError) as e:
        load_prepared_dataset(root)
    msg = str(e.value)
    assert "duplicate sample_id 's0' on lines 2, 4" in msg and str(root / "index.csv") in msg


@pytest.mark.parametrize("bad_id,why", [("a/b", "cannot be used as a file name"), ("", "sample_id is empty")])
def test_bad_sample_id(tmp_path: Path, bad_id: str, why: str) -> None:
    root = tmp_path / "ds"
    make_dataset(root)
    edit_index(root, lambda df: df.assign(sample_id=["s0", bad_id, "s2", "s3"]))
    with pytest.raises(MSBError, match=why) as e:
        load_prepared_dataset(root)
    assert "line 3" in str(e.value)


def test_bad_split_value(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    make_dataset(root)
    edit_index(root, lambda df: df.assign(split=["train", "validation", "test", ""]))
    with pytest.raises(MSBError, match=r"index.csv line 3 \(sample_id 's1'\): split 'validation' is not one of"):
        load_prepared_dataset(root)


def test_bad_height(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    make_dataset(root)
    edit_index(root, lambda df: df.assign(height=["12", "12", "x", "12"]))
    with pytest.raises(MSBError, match=r"line 4 \(sample_id 's2'\): height 'x' is not a positive integer"):
        load_prepared_dataset(root)


def test_absolute_path_rejected(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    make_dataset(root)
    edit_index(root, lambda df: df.assign(image_path=[str(root / "images/s0.png")] + df["image_path"].tolist()[1:]))
    with pytest.raises(MSBError, match=r"line 2 \(sample_id 's0'\): image_path .* is absolute"):
        load_prepared_dataset(root)


@pytest.mark.parametrize("kind", ["image", "mask"])
def test_missing_file(tmp_path: Path, kind: str) -> None:
    root = tmp_path / "ds"
    make_dataset(root)
    missing = root / f"{kind}s" / "s1.png"
    missing.unlink()
    with pytest.raises(MSBError) as e:
        load_prepared_dataset(root)
    msg = str(e.value)
    assert f"line 3 (sample_id 's1'): {kind} file {missing} is missing" in msg
    assert "1 problem(s)" in msg
    # without file checks the index itself still loads
    assert len(load_prepared_dataset(root, check_files=False)) == 4


def test_image_mask_size_mismatch(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    make_dataset(root)
    cv2.imwrite(str(root / "masks" / "s3.png"), np.zeros((12, 15), np.uint8))
    with pytest.raises(MSBError) as e:
        load_prepared_dataset(root)
    msg = str(e.value)
    assert "line 5 (sample_id 's3')" in msg and "is 12x16 (HxW) but mask" in msg and "s3.png is 12x15" in msg


def test_index_size_mismatch(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    make_dataset(root)
    edit_index(root, lambda df: df.assign(width=["16", "17", "16", "16"]))
    with pytest.raises(MSBError, match=r"line 3 \(sample_id 's1'\): image .*s1.png is 12x16 \(HxW\) but index.csv "
                                       r"says height=12, width=17"):
        load_prepared_dataset(root)


def test_unreadable_image(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    make_dataset(root)
    (root / "images" / "s0.png").write_bytes(b"not a png")
    with pytest.raises(MSBError, match=r"line 2 \(sample_id 's0'\): image file .*s0.png is not a readable image"):
        load_prepared_dataset(root)
    with pytest.raises(MSBError, match="cannot decode image"):
        read_image(root / "images" / "s0.png")


def test_uncovered_mask_values(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    make_dataset(root)
    bad = np.zeros((12, 16), np.uint8)
    bad[0, :3] = 7
    bad[1, 0] = 255
    cv2.imwrite(str(root / "masks" / "s2.png"), bad)
    load_prepared_dataset(root)  # header checks pass
    with pytest.raises(MSBError) as e:
        load_prepared_dataset(root, check_mask_values=True)
    msg = str(e.value)
    assert "line 4 (sample_id 's2')" in msg and "s2.png: mask values not covered by classes.csv: 7 (3 px)" in msg
    with pytest.raises(MSBError, match=r"s2.png: mask values not covered by classes.csv: 7 \(3 px\)"):
        mask_to_onehot(read_mask(root / "masks" / "s2.png"), CLASSES, root / "masks" / "s2.png")


def test_missing_index_and_classes(tmp_path: Path) -> None:
    with pytest.raises(MSBError, match="prepared dataset folder not found"):
        load_prepared_dataset(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(MSBError, match="index.csv: not found"):
        load_prepared_dataset(tmp_path / "empty")
    root = tmp_path / "ds"
    make_dataset(root)
    (root / "classes.csv").unlink()
    with pytest.raises(MSBError, match="classes file .*classes.csv not found; a prepared dataset needs classes.csv"):
        load_prepared_dataset(root)


@pytest.mark.parametrize("text,match", [
    ("class_id,name,source_values\n1,polyp,255\n2,other,128\n", "contiguous 0..1"),
    ("class_id,name,source_values\n0,background,0\n1,polyp,0;255\n", "raw mask value 0 is listed under class_id 0"),
    ("class_id,name,source_values\n0,background,0\n1,polyp,x\n", r"line 3: source_values 'x' must be"),
    ("class_id,name,source_values\n0,background,0\none,polyp,255\n", r"line 3: class_id 'one' is not an integer"),
    ("class_id,name,source_values\n0,background,0\n", "at least one foreground class"),
    ("class_id,name\n0,background\n", r"missing column\(s\) \['source_values'\]"),
    ("class_id,name,source_values\n0,background,0\n1,polyp,\n", r"class_id 1 \('polyp'\) has no source_values"),
])
def test_bad_classes_csv(tmp_path: Path, text: str, match: str) -> None:
    p = tmp_path / "classes.csv"
    p.write_text(text)
    with pytest.raises(MSBError, match=match) as e:
        read_classes(p)
    assert str(p) in str(e.value)


def test_read_classes_multi_values(tmp_path: Path) -> None:
    p = tmp_path / "classes.csv"
    p.write_text("class_id,name,source_values\n2,b,3;4\n0,background,0\n1,a,1\n")
    assert read_classes(p) == [ClassSpec(0, "background", (0,)), ClassSpec(1, "a", (1,)), ClassSpec(2, "b", (3, 4))]


def test_write_prepared_dataset_bad_classes_writes_nothing(tmp_path: Path) -> None:
    index = pd.DataFrame([{"sample_id": "a", "image_path": "i.png", "mask_path": "m.png", "split": "",
                           "group": "", "height": 1, "width": 1, "source": "x"}])
    with pytest.raises(MSBError):
        write_prepared_dataset(tmp_path / "out", index, [ClassSpec(1, "x", (1,))])
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []
    with pytest.raises(MSBError, match=r"missing column\(s\) \['split'"):
        write_prepared_dataset(tmp_path / "out2", index.drop(columns=["split"]), CLASSES)
    assert not (tmp_path / "out2").exists() or list((tmp_path / "out2").iterdir()) == []


def test_write_roundtrip_column_order(tmp_path: Path) -> None:
    index = pd.DataFrame([{"extra": 5, "source": "x", "width": 2, "height": 3, "group": "", "split": "train",
                           "mask_path": "m.png", "image_path": "i.png", "sample_id": "a", "spacing_row": 0.5}])
    write_prepared_dataset(tmp_path, index, CLASSES)
    header = (tmp_path / "index.csv").read_text().splitlines()[0]
    assert header == "sample_id,image_path,mask_path,split,group,height,width,source,spacing_row,extra"
    assert (tmp_path / "classes.csv").read_text() == "class_id,name,source_values\n0,background,0\n1,polyp,255\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_read_image_grey_and_rgb_order(tmp_path: Path) -> None:
    grey = np.arange(12, dtype=np.uint8).reshape(3, 4) * 20
    Image.fromarray(grey).save(tmp_path / "g.png")
    img = read_image(tmp_path / "g.png")
    assert img.shape == (3, 4, 3) and img.dtype == np.uint8
    assert np.array_equal(img[..., 0], grey) and np.array_equal(img[..., 2], grey)
    rgb = np.zeros((2, 2, 3), np.uint8)
    rgb[..., 0] = 200  # red
    Image.fromarray(rgb).save(tmp_path / "r.png")
    out = read_image(tmp_path / "r.png")
    assert out[0, 0].tolist() == [200, 0, 0]
    with pytest.raises(MSBError, match="cannot read image file"):
        read_image(tmp_path / "missing.png")


def test_read_mask_modes(tmp_path: Path) -> None:
    m = np.array([[0, 1], [2, 255]], np.uint8)
    Image.fromarray(m).save(tmp_path / "l.png")
    assert read_mask(tmp_path / "l.png").tolist() == m.tolist()
    # palette: indices, not colours
    pal = Image.fromarray(np.array([[0, 1], [2, 1]], np.uint8)).convert("P")
    pal.putpalette([0, 0, 0, 255, 0, 0, 0, 255, 0] + [0] * (256 * 3 - 9))
    pal.save(tmp_path / "pal.png")
    assert read_mask(tmp_path / "pal.png").tolist() == [[0, 1], [2, 1]]
    # 1-bit -> 0/1
    Image.fromarray(np.array([[True, False]])).save(tmp_path / "b.png")
    b = read_mask(tmp_path / "b.png")
    assert b.dtype == np.uint8 and b.tolist() == [[1, 0]]
    # 16 bit
    cv2.imwrite(str(tmp_path / "u16.png"), np.array([[0, 1000]], np.uint16))
    assert read_mask(tmp_path / "u16.png").tolist() == [[0, 1000]]
    # RGB with equal channels -> one channel
    Image.fromarray(np.stack([m] * 3, -1)).save(tmp_path / "rgb.png")
    assert read_mask(tmp_path / "rgb.png").tolist() == m.tolist()
    # RGBA opaque -> ok; translucent -> error
    rgba = np.dstack([m, m, m, np.full_like(m, 255)])
    Image.fromarray(rgba).save(tmp_path / "rgba.png")
    assert read_mask(tmp_path / "rgba.png").tolist() == m.tolist()
    rgba[0, 0, 3] = 0
    Image.fromarray(rgba).save(tmp_path / "rgba2.png")
    with pytest.raises(MSBError, match="rgba2.png: mask has a translucent alpha"):
        read_mask(tmp_path / "rgba2.png")
    # colour-coded -> error naming file and count
    col = np.zeros((2, 2, 3), np.uint8)
    col[0, 0] = (255, 0, 0)
    col[1, 1] = (0, 255, 0)
    Image.fromarray(col).save(tmp_path / "col.png")
    with pytest.raises(MSBError, match=r"col.png: colour mask with different R/G/B values at 2 pixel\(s\)"):
        read_mask(tmp_path / "col.png")
    with pytest.raises(MSBError, match="mask file not found"):
        read_mask(tmp_path / "none.png")
    (tmp_path / "junk.png").write_bytes(b"junk")
    with pytest.raises(MSBError, match="junk.png: cannot decode mask"):
        read_mask(tmp_path / "junk.png")


def test_mask_to_onehot_multiclass() -> None:
    classes = [ClassSpec(2, "b", (7, 8)), ClassSpec(0, "background", (0,)), ClassSpec(1, "a", (3,))]
    raw = np.array([[0, 3, 7], [8, 0, 3]], np.uint8)
    oh = mask_to_onehot(raw, classes, "m.png")
    assert oh.shape == (2, 2, 3) and oh.dtype == bool
    assert oh[0].tolist() == [[False, True, False], [False, False, True]]
    assert oh[1].tolist() == [[False, False, True], [True, False, False]]
    assert mask_to_label_map(raw, classes).tolist() == [[0, 1, 2], [2, 0, 1]]
    with pytest.raises(MSBError, match=r"m.png: mask values not covered by classes.csv: 4 \(1 px\), 300 \(1 px\)"):
        mask_to_onehot(np.array([[0, 4, 300]], np.uint16), classes, "m.png")
    with pytest.raises(MSBError, match="2-D integer"):
        mask_to_onehot(np.zeros((2, 2, 3), np.uint8), classes, "m.png")
    assert mask_to_onehot(np.array([[True, False]]), [ClassSpec(0, "bg", (0,)), ClassSpec(1, "fg", (1,))]).tolist() \
        == [[[True, False]]]
