"""Converters: Kvasir-SEG (real first 5 pairs + synthetic JPEG sources), generic folder converter, registry, cards.

Every failing conversion must raise MSBError naming the file and leave neither the output folder nor a temporary
folder behind.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml
from PIL import Image

from msb.data.converters import CONVERTERS, ConversionReport, prepare_dataset
from msb.data.converters.kvasir_seg import NEAR_DUPLICATE_PAIRS
from msb.data.schema import load_prepared_dataset, read_mask
from msb.errors import MSBError

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"
KVASIR = SHARED / "data" / "kvasir-seg"
BUSI = SHARED / "data" / "busi"


def need(path: Path) -> Path:
    if not path.is_dir():
        pytest.skip(f"real data not found at {path}: put the shared folder beside the repository root (../shared)")
    return path


def assert_clean(out: Path) -> None:
    """No output folder and no hidden temporary sibling left behind."""
    assert not out.exists(), f"{out} left behind"
    leftovers = [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]
    assert leftovers == [], leftovers


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def make_kvasir_like(root: Path, n: int = 3, hw: tuple[int, int] = (40, 48)) -> Path:
    """A Kvasir-like source: JPEG images and 3-channel JPEG masks (noisy) with the same names."""
    rng = np.random.default_rng(1)
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir(parents=True)
    for i in range(n):
        img = rng.integers(0, 255, (*hw, 3), dtype=np.uint8)
        m = np.zeros(hw, np.uint8)
        m[5:20 + i, 8:30] = 255
        cv2.imwrite(str(root / "images" / f"id{i}.jpg"), img)
        cv2.imwrite(str(root / "masks" / f"id{i}.jpg"), np.dstack([m] * 3), [cv2.IMWRITE_JPEG_QUALITY, 75])
    (root / "kavsir_bboxes.json").write_text("{}")
    return root


# ------------------------------------------------------------------------------------------ Kvasir-SEG (real)
@pytest.mark.shared_data
def test_kvasir_real_first_five(tmp_path: Path) -> None:
    src = need(KVASIR)
    out = tmp_path / "kvasir"
    report = prepare_dataset("kvasir-seg", src, out, limit=5)
    names = sorted(p.name for p in (src / "images").iterdir())[:5]
    # independent count on the raw JPEG masks: pixels neither 0 nor 255
    expected_changed, expected_pixels = 0, 0
    for name in names:
        raw = np.asarray(Image.open(src / "masks" / name))
        assert raw.ndim == 3 and np.array_equal(raw[..., 0], raw[..., 1]) and np.array_equal(raw[..., 0], raw[..., 2])
        v = raw[..., 0]
        expected_changed += int(((v != 0) & (v != 255)).sum())
        expected_pixels += v.size
    assert isinstance(report, ConversionReport)
    assert report.n_samples == 5
    assert report.n_changed_mask_pixels == expected_changed > 0
    assert report.n_mask_pixels == expected_pixels
    assert f"{expected_changed:,}" in report.summary()
    ds = load_prepared_dataset(out, check_mask_values=True)
    assert ds.sample_ids == [n[:-4] for n in names]
    assert ds.index["source"].eq("kvasir-seg").all() and ds.index["split"].eq("").all()
    assert [(c.class_id, c.name, c.source_values) for c in ds.classes] == [(0, "background", (0,)),
                                                                         (1, "polyp", (255,))]
    for name in names:
        sid = name[:-4]
        assert sha(ds.image_path(sid)) == sha(src / "images" / name)  # byte copy
        m = read_mask(ds.mask_path(sid))
        assert set(np.unique(m).tolist()) == {0, 255}
        raw = np.asarray(Image.open(src / "masks" / name))[..., 0]
        assert np.array_equal(m, np.where(raw > 127, 255, 0))
        h, w = raw.shape
        row = ds.row(sid)
        assert (row["height"], row["width"]) == (h, w)
    assert [p.name for p in tmp_path.iterdir()] == ["kvasir"]


@pytest.mark.shared_data
def test_kvasir_real_near_duplicate_groups(tmp_path: Path) -> None:
    """Build a mini source from one near-duplicate pair (symlinks) and check the shared group."""
    src = need(KVASIR)
    mini = tmp_path / "src"
    (mini / "images").mkdir(parents=True)
    (mini / "masks").mkdir()
    a, b = NEAR_DUPLICATE_PAIRS[0]
    for sid in (a, b, "cju0qkwl35piu0993l0dewei2"):
        for sub in ("images", "masks"):
            (mini / sub / f"{sid}.jpg").symlink_to(src / sub / f"{sid}.jpg")
    prepare_dataset("kvasir_seg", mini, tmp_path / "out")
    ds = load_prepared_dataset(tmp_path / "out")
    groups = dict(zip(ds.index["sample_id"], ds.index["group"]))
    assert groups == {a: "neardup_1", b: "neardup_1", "cju0qkwl35piu0993l0dewei2": ""}


# ------------------------------------------------------------------------------------------ Kvasir-SEG (errors)
def test_kvasir_like_converts_and_counts(tmp_path: Path) -> None:
    src = make_kvasir_like(tmp_path / "src")
    out = tmp_path / "out"
    report = prepare_dataset("kvasir-seg", src, out)
    expected = sum(int(((v != 0) & (v != 255)).sum())
                   for v in (cv2.imread(str(p), cv2.IMREAD_GRAYSCALE) for p in sorted((src / "masks").iterdir())))
    assert report.n_samples == 3 and report.n_changed_mask_pixels == expected > 0
    ds = load_prepared_dataset(out, check_mask_values=True)
    assert ds.sample_ids == ["id0", "id1", "id2"]
    assert all(set(np.unique(read_mask(ds.mask_path(s))).tolist()) <= {0, 255} for s in ds.sample_ids)


def test_kvasir_missing_subfolder(tmp_path: Path) -> None:
    src = make_kvasir_like(tmp_path / "src")
    for p in (src / "masks").iterdir():
        p.unlink()
    (src / "masks").rmdir()
    out = tmp_path / "out"
    with pytest.raises(MSBError, match=r"src: images/ found but no mask folder beside it \(masks/, mask/.*--source must be the folder holding both"):
        prepare_dataset("kvasir-seg", src, out)
    assert_clean(out)


def test_kvasir_unpaired(tmp_path: Path) -> None:
    src = make_kvasir_like(tmp_path / "src")
    (src / "masks" / "id1.jpg").rename(src / "masks" / "other.jpg")
    out = tmp_path / "out"
    with pytest.raises(MSBError) as e:
        prepare_dataset("kvasir-seg", src, out)
    msg = str(e.value)
    assert "1 image(s) without a mask" in msg and "id1.jpg" in msg and "1 mask(s) without an image" in msg \
        and "other.jpg" in msg
    assert_clean(out)


def test_kvasir_size_mismatch(tmp_path: Path) -> None:
    src = make_kvasir_like(tmp_path / "src")
    cv2.imwrite(str(src / "masks" / "id2.jpg"), np.zeros((40, 47, 3), np.uint8))
    out = tmp_path / "out"
    with pytest.raises(MSBError) as e:
        prepare_dataset("kvasir-seg", src, out)
    msg = str(e.value)
    assert "images/id2.jpg is 40x48 (HxW) but its mask" in msg and "masks/id2.jpg is 40x47" in msg
    assert "sample_id 'id2'" in msg
    assert_clean(out)


def test_kvasir_corrupt_mask(tmp_path: Path) -> None:
    src = make_kvasir_like(tmp_path / "src")
    (src / "masks" / "id1.jpg").write_bytes(b"\xff\xd8 truncated")
    out = tmp_path / "out"
    with pytest.raises(MSBError, match=r"masks/id1.jpg: cannot decode mask"):
        prepare_dataset("kvasir-seg", src, out)
    assert_clean(out)


def test_kvasir_corrupt_image(tmp_path: Path) -> None:
    src = make_kvasir_like(tmp_path / "src")
    (src / "images" / "id0.jpg").write_bytes(b"garbage")
    out = tmp_path / "out"
    with pytest.raises(MSBError, match=r"images/id0.jpg: not a readable image"):
        prepare_dataset("kvasir-seg", src, out)
    assert_clean(out)


def test_kvasir_refuses_overwrite_then_overwrites(tmp_path: Path) -> None:
    src = make_kvasir_like(tmp_path / "src")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    with pytest.raises(MSBError, match="already exists and is not empty; pass --overwrite"):
        prepare_dataset("kvasir-seg", src, out)
    assert (out / "keep.txt").read_text() == "precious"
    # an error during an overwrite keeps the old folder intact
    (src / "masks" / "id0.jpg").write_bytes(b"bad")
    with pytest.raises(MSBError):
        prepare_dataset("kvasir-seg", src, out, overwrite=True)
    assert (out / "keep.txt").read_text() == "precious"
    make_kvasir_like(tmp_path / "src2")
    report = prepare_dataset("kvasir-seg", tmp_path / "src2", out, overwrite=True)
    assert report.n_samples == 3 and not (out / "keep.txt").exists() and (out / "index.csv").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "src", "src2"]
    # empty existing folder is fine without overwrite
    (tmp_path / "empty").mkdir()
    assert prepare_dataset("kvasir-seg", tmp_path / "src2", tmp_path / "empty").n_samples == 3


def test_kvasir_out_inside_source_refused(tmp_path: Path) -> None:
    src = make_kvasir_like(tmp_path / "src")
    with pytest.raises(MSBError, match="overlap"):
        prepare_dataset("kvasir-seg", src, src / "prepared")
    with pytest.raises(MSBError, match="overlap"):
        prepare_dataset("kvasir-seg", src, src, overwrite=True)
    assert sorted(p.name for p in src.iterdir()) == ["images", "kavsir_bboxes.json", "masks"]


def test_kvasir_bad_limit(tmp_path: Path) -> None:
    src = make_kvasir_like(tmp_path / "src")
    with pytest.raises(MSBError, match="limit must be a positive integer"):
        prepare_dataset("kvasir-seg", src, tmp_path / "out", limit=0)
    assert_clean(tmp_path / "out")
    assert prepare_dataset("kvasir-seg", src, tmp_path / "out", limit=2).n_samples == 2


# ------------------------------------------------------------------------------------------ registry
def test_registry_and_unknown_names(tmp_path: Path) -> None:
    assert {"kvasir-seg", "folder", "synthetic", "merge"} <= set(CONVERTERS)
    with pytest.raises(MSBError, match="unknown dataset converter 'nope'; valid names: bcss, bkai-igh-neopolyp, busi, "
                                       "camus, cvc-300, cvc-clinicdb, cvc-colondb, etis-larib, folder, "
                                       "isic2018-task1, kvasir-seg, merge, pranet, synthetic"):
        prepare_dataset("nope", tmp_path, tmp_path / "out")
    with pytest.raises(MSBError, match=r"unknown option\(s\) \['bogus'\] for converter 'kvasir-seg'; valid options: "
                                       r"limit, threshold"):
        prepare_dataset("kvasir-seg", tmp_path, tmp_path / "out", bogus=1)
    with pytest.raises(MSBError, match="needs a source folder"):
        prepare_dataset("folder", None, tmp_path / "out")
    report = prepare_dataset("synthetic", None, tmp_path / "syn", n_samples=6, size=(24, 24))
    assert report.n_samples == 6 and (tmp_path / "syn" / "index.csv").is_file()
    assert_clean(tmp_path / "out")


# ------------------------------------------------------------------------------------------ folder converter
def write_png(path: Path, arr: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    assert cv2.imwrite(str(path), arr)


def test_folder_multiclass_keeps_values(tmp_path: Path) -> None:
    src = tmp_path / "src"
    for i, stem in enumerate(["b", "a", "c"]):
        write_png(src / "imgs" / f"{stem}.png", np.full((10, 12, 3), 30 * i, np.uint8))
        m = np.zeros((10, 12), np.uint8)
        m[0, : i + 1] = 1
        m[1, :2] = 2 if stem != "c" else 0
        write_png(src / "labels" / f"{stem}_seg.png", m)
    (src / "imgs" / "notes.txt").write_text("ignore me")
    out = tmp_path / "out"
    report = prepare_dataset("folder", src, out, images_dir="imgs", masks_dir="labels", mask_suffix="_seg",
                             class_names={1: "liver", 2: "tumour"})
    assert report.n_samples == 3 and report.n_changed_mask_pixels == 0
    assert any("ignored 1 non-image file" in n for n in report.notes)
    ds = load_prepared_dataset(out, check_mask_values=True)
    assert ds.sample_ids == ["a", "b", "c"]
    assert [(c.class_id, c.name, c.source_values) for c in ds.classes] == [
        (0, "background", (0,)), (1, "liver", (1,)), (2, "tumour", (2,))]
    assert ds.index["source"].eq("src").all()
    oh = ds.load_onehot("b")
    assert oh.shape == (2, 10, 12) and int(oh[0].sum()) == 1 and int(oh[1].sum()) == 2
    assert sha(ds.image_path("a")) == sha(src / "imgs" / "a.png")


def test_folder_threshold_and_counts(tmp_path: Path) -> None:
    src = tmp_path / "src"
    m = np.array([[0, 1, 127, 128], [200, 255, 255, 3]], np.uint8)
    write_png(src / "images" / "x.png", np.zeros((2, 4, 3), np.uint8))
    write_png(src / "masks" / "x.png", m)
    report = prepare_dataset("folder", src, tmp_path / "out", threshold=127, foreground_name="lesion")
    # changed: 1->0, 127->0, 128->255, 200->255, 3->0  (0 and 255 unchanged)
    assert report.n_changed_mask_pixels == 5 and report.n_mask_pixels == 8
    out = read_mask(tmp_path / "out" / "masks" / "x.png")
    assert out.tolist() == [[0, 0, 0, 255], [255, 255, 255, 0]]
    assert load_prepared_dataset(tmp_path / "out").classes[1].name == "lesion"


def test_folder_same_dir_pairing_and_unpaired(tmp_path: Path) -> None:
    src = tmp_path / "src"
    for stem in ("p1", "p2", "p3"):
        write_png(src / "all" / f"{stem}.png", np.zeros((4, 4, 3), np.uint8))
    for stem in ("p1", "p2"):
        write_png(src / "all" / f"{stem}_mask.png", np.full((4, 4), 255, np.uint8))
    write_png(src / "all" / "orphan_mask.png", np.zeros((4, 4), np.uint8))
    out = tmp_path / "out"
    with pytest.raises(MSBError) as e:
        prepare_dataset("folder", src, out, images_dir="all", masks_dir="all", mask_suffix="_mask")
    msg = str(e.value)
    assert "1 image(s) without a mask '<stem>_mask.<ext>'" in msg and "p3.png" in msg
    assert "1 mask(s) without an image" in msg and "orphan_mask.png" in msg and "allow_unpaired=True" in msg
    assert_clean(out)
    report = prepare_dataset("folder", src, out, images_dir="all", masks_dir="all", mask_suffix="_mask",
                             allow_unpaired=True)
    assert report.n_samples == 2
    assert any("skipped 1 image(s) without a mask: p3.png" in n for n in report.notes)
    with pytest.raises(MSBError, match="mask_suffix is empty"):
        prepare_dataset("folder", src, tmp_path / "o2", images_dir="all", masks_dir="all")
    assert_clean(tmp_path / "o2")


@pytest.mark.parametrize("case", ["jpeg_no_threshold", "ambiguous", "duplicate_stem", "no_pairs", "all_zero",
                                  "missing_dir", "size_mismatch"])
def test_folder_errors_leave_nothing(tmp_path: Path, case: str) -> None:
    src = tmp_path / "src"
    write_png(src / "images" / "a.png", np.zeros((6, 6, 3), np.uint8))
    write_png(src / "masks" / "a.png", np.full((6, 6), 255, np.uint8))
    opts: dict = {}
    if case == "jpeg_no_threshold":
        (src / "masks" / "a.png").unlink()
        cv2.imwrite(str(src / "masks" / "a.jpg"), np.zeros((6, 6), np.uint8))
        match = r"1 mask\(s\) are JPEG \(lossy\): a.jpg.*Pass a threshold"
    elif case == "ambiguous":
        write_png(src / "masks" / "a.bmp", np.zeros((6, 6), np.uint8))
        match = "several mask files match one image stem: a.bmp / a.png"
    elif case == "duplicate_stem":
        cv2.imwrite(str(src / "images" / "a.jpg"), np.zeros((6, 6, 3), np.uint8))
        match = "several images share a stem"
    elif case == "no_pairs":
        opts = {"mask_suffix": "_m", "allow_unpaired": True}
        match = "no image/mask pairs found"
    elif case == "all_zero":
        write_png(src / "masks" / "a.png", np.zeros((6, 6), np.uint8))
        match = "every mask contains only the value 0"
    elif case == "missing_dir":
        opts = {"masks_dir": "labels"}
        match = "masks folder .*labels not found"
    else:
        write_png(src / "masks" / "a.png", np.zeros((5, 6), np.uint8))
        match = r"images/a.png is 6x6 \(HxW\) but its mask .*masks/a.png is 5x6"
    out = tmp_path / "out"
    with pytest.raises(MSBError, match=match):
        prepare_dataset("folder", src, out, **opts)
    assert_clean(out)


@pytest.mark.shared_data
def test_folder_on_real_busi_subset(tmp_path: Path) -> None:
    """BUSI masks are 1-bit / RGB / RGBA PNGs named '<stem>_mask.png': threshold 0 gives {0,255}."""
    src = need(BUSI)
    report = prepare_dataset("folder", src, tmp_path / "busi", mask_suffix="_mask", threshold=0,
                             allow_unpaired=True, limit=4, foreground_name="lesion")
    ds = load_prepared_dataset(tmp_path / "busi", check_mask_values=True)
    assert report.n_samples == 4 == len(ds)
    assert any("mask(s) without an image" in n for n in report.notes)  # the '_mask_1' extra lesion files
    expected = 0
    for sid in ds.sample_ids:
        raw = np.asarray(Image.open(src / "masks" / f"{sid}_mask.png"))
        raw = raw[..., 0] if raw.ndim == 3 else raw.astype(np.uint8)
        expected += int(((raw != 0) & (raw != 255)).sum())
        assert np.array_equal(read_mask(ds.mask_path(sid)) == 255, raw > 0)
    assert report.n_changed_mask_pixels == expected


# ------------------------------------------------------------------------------------------ dataset cards
def test_dataset_cards() -> None:
    cards = {p.stem: yaml.safe_load(p.read_text()) for p in (REPO / "datasets").glob("*.yaml")}
    assert {"kvasir_seg", "synthetic", "busi"} <= set(cards)
    for stem, card in cards.items():
        for key in ("name", "citation", "licence", "official_url", "converter", "class_map", "known_pitfalls"):
            assert key in card, f"datasets/{stem}.yaml lacks {key}"
        assert card["converter"] is None or card["converter"] in CONVERTERS
        assert card["class_map"][0] == {"class_id": 0, "name": "background", "source_values": [0]}
        assert len(card["known_pitfalls"]) >= 3
    assert cards["kvasir_seg"]["converter"] == "kvasir-seg"
    assert cards["busi"]["converter"] == "busi"
    assert "10.1007/978-3-030-37734-2_37" in cards["kvasir_seg"]["doi"]


def test_report_summary() -> None:
    r = ConversionReport(n_samples=2, n_changed_mask_pixels=5, notes=["hello"], out=Path("/x"), name="folder",
                         n_mask_pixels=1000)
    s = r.summary()
    assert "Prepared 2 sample(s) (folder) in /x." in s and "5 of 1,000 mask pixels (0.500 %)" in s and "- hello" in s


def test_folder_threshold_colour_mask_uses_channel_mean(tmp_path: Path) -> None:
    """In binarise mode a colour mask with unequal channels is thresholded on its rounded channel mean (noted)."""
    src = tmp_path / "src"
    write_png(src / "images" / "x.png", np.zeros((1, 3, 3), np.uint8))
    rgb = np.array([[[255, 255, 240], [0, 10, 2], [100, 200, 90]]], np.uint8)  # means 250, 4, 130
    (src / "masks").mkdir()
    Image.fromarray(rgb).save(src / "masks" / "x.png")
    with pytest.raises(MSBError, match="colour mask with different R/G/B values"):
        prepare_dataset("folder", src, tmp_path / "keep")
    assert_clean(tmp_path / "keep")
    report = prepare_dataset("folder", src, tmp_path / "out", threshold=127)
    assert read_mask(tmp_path / "out" / "masks" / "x.png").tolist() == [[255, 0, 255]]
    assert report.n_changed_mask_pixels == 3
    assert any("1 colour mask(s) had unequal R/G/B channels" in n for n in report.notes)
