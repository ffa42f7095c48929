"""Every converter on every layout it claims (official, ``images/ + masks/``, PraNet ``TrainDataset`` /
``TestDataset``), groups CSVs with named columns, and the folder converter's refusal of noisy masks.

Sources are tiny files written here; expected masks are ``raw > 127 -> 255`` computed from the written source
pixels (``raw > 0`` union for BUSI, the red/green rule by hand for BKAI), independently of the converters.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from msb.data.converters import prepare_dataset
from msb.data.schema import load_prepared_dataset, read_mask
from msb.errors import MSBError

REPO = Path(__file__).resolve().parents[2]
HW = (12, 16)


def _img(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, (*HW, 3), dtype=np.uint8)


def _mask(seed: int) -> np.ndarray:
    """A square of 255 with a rim of in-between values (JPEG-like noise on both sides of 127)."""
    m = np.zeros(HW, np.uint8)
    m[3:9, 4 + seed % 3: 12] = 255
    m[2, 4:12] = np.random.default_rng(seed).choice([1, 60, 127, 128, 200, 254], 8)
    return m


def _put(path: Path, arr: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr).save(path)


def _pair(img_path: Path, mask_path: Path, seed: int, masks: dict, key: str) -> None:
    _put(img_path, _img(seed))
    masks[key] = _mask(seed)
    _put(mask_path, masks[key])


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _check(out: Path, masks: dict[str, np.ndarray], ids: list[str], split: str = "") -> None:
    """Prepared dataset at ``out`` holds ``ids`` in order, masks = source > 127, the given split."""
    ds = load_prepared_dataset(out, check_mask_values=True)
    assert ds.sample_ids == ids
    for sid in ids:
        assert np.array_equal(read_mask(ds.mask_path(sid)), np.where(masks[sid] > 127, 255, 0)), sid
    assert ds.index["split"].eq(split).all()


# ------------------------------------------------------------------------------------------ PraNet copies
def _pranet(root: Path, train: list[str], test: dict[str, list[str]], masks: dict) -> None:
    for k, stem in enumerate(train):
        _pair(root / "TrainDataset/image" / f"{stem}.png", root / "TrainDataset/mask" / f"{stem}.png", k, masks,
              f"train/{stem}")
    for name, stems in test.items():
        for k, stem in enumerate(stems):
            _pair(root / "TestDataset" / name / "images" / f"{stem}.png",
                  root / "TestDataset" / name / "masks" / f"{stem}.png", 50 + k, masks, f"test/{name}/{stem}")


@pytest.mark.parametrize("name,test_set,train_ids", [
    ("kvasir-seg", "Kvasir", ["cjuaaa", "cju30bmab08bi0835mvlr6e0r"]),
    ("cvc-clinicdb", "CVC-ClinicDB", ["3", "12"]),
    ("cvc-colondb", "CVC-ColonDB", []),
    ("etis-larib", "ETIS-LaribPolypDB", []),
    ("cvc-300", "CVC-300", []),
])
def test_pranet_layout_per_dataset(tmp_path: Path, name: str, test_set: str, train_ids: list[str]) -> None:
    """Each polyp converter takes only its own rows of a PraNet folder, split as shipped."""
    masks: dict = {}
    _pranet(tmp_path / "src", ["3", "12", "cjuaaa", "cju30bmab08bi0835mvlr6e0r"],
            {"Kvasir": ["cjubbb"], "CVC-ClinicDB": ["7", "3"], "CVC-ColonDB": ["1", "2"],
             "ETIS-LaribPolypDB": ["5"], "CVC-300": ["150"]}, masks)
    rep = prepare_dataset(name, tmp_path / "src", tmp_path / "out")
    ds = load_prepared_dataset(tmp_path / "out", check_mask_values=True)
    test_ids = sorted((k.split("/")[2] for k in masks if k.startswith(f"test/{test_set}/")), key=int
                      if test_set != "Kvasir" else str)
    train_sorted = sorted(train_ids, key=lambda s: (not s.isdigit(), int(s) if s.isdigit() else 0, s))
    collide = set(train_ids) & set(test_ids)
    expect = ([f"train-{s}" if collide else s for s in train_sorted]
              + [f"test-{s}" if collide else s for s in test_ids])
    assert ds.sample_ids == expect
    assert ds.index["split"].tolist() == ["train"] * len(train_ids) + ["test"] * len(test_ids)
    for sid, split in zip(ds.sample_ids, ds.index["split"]):
        stem = sid.split("-", 1)[1] if collide else sid
        key = f"train/{stem}" if split == "train" else f"test/{test_set}/{stem}"
        assert np.array_equal(read_mask(ds.mask_path(sid)), np.where(masks[key] > 127, 255, 0)), sid
    assert any(n.startswith("layout: pranet") for n in rep.notes)
    if name == "kvasir-seg":  # the known near-duplicate id keeps its group in a PraNet copy too
        assert ds.index.set_index("sample_id").loc["cju30bmab08bi0835mvlr6e0r", "group"] == "neardup_1"


# ------------------------------------------------------------------------------------ images/ + masks/
@pytest.mark.parametrize("name", ["kvasir-seg", "cvc-clinicdb", "cvc-colondb", "etis-larib", "cvc-300"])
def test_images_masks_layout(tmp_path: Path, name: str) -> None:
    masks: dict = {}
    for k, stem in enumerate(["10", "2", "209", "300"]):
        _pair(tmp_path / "src/images" / f"{stem}.png", tmp_path / "src/masks" / f"{stem}.png", k, masks, stem)
    rep = prepare_dataset(name, tmp_path / "src", tmp_path / "out")
    _check(tmp_path / "out", masks, ["2", "10", "209", "300"])  # natural name order
    assert rep.notes[0].startswith("layout: images-masks") and rep.n_changed_mask_pixels == sum(
        int((np.where(m > 127, 255, 0) != m).sum()) for m in masks.values())
    ds = load_prepared_dataset(tmp_path / "out")
    if name == "cvc-colondb":  # frames 2, 10 in sequence 1; 209 in 11 and 300 in 15 (merged): README table
        assert ds.index["group"].tolist() == ["seq1", "seq1", "seq11+15", "seq11+15"]
    else:
        assert ds.index["group"].eq("").all()


def test_images_masks_layout_isic_bkai_busi(tmp_path: Path) -> None:
    masks: dict = {}
    for k, sid in enumerate(["ISIC_0000002", "ISIC_0000001"]):  # ISIC: masks carry the _segmentation suffix
        _pair(tmp_path / "isic/images" / f"{sid}.jpg", tmp_path / "isic/masks" / f"{sid}_segmentation.png", k,
              masks, sid)
    prepare_dataset("isic2018-task1", tmp_path / "isic", tmp_path / "o_isic")
    _check(tmp_path / "o_isic", masks, ["ISIC_0000001", "ISIC_0000002"])
    # BKAI: colour masks; red -> 1, green -> 2 by the channel rule (t = 127)
    rgb = np.zeros((*HW, 3), np.uint8)
    rgb[1:4, 1:5] = (254, 0, 0)
    rgb[6:9, 6:10] = (0, 255, 1)
    rgb[10, 0] = (200, 150, 0)  # both channels on: the larger (R) wins
    _put(tmp_path / "bkai/images/a.jpeg", _img(1))
    _put(tmp_path / "bkai/masks/a.png", rgb)
    prepare_dataset("bkai-igh-neopolyp", tmp_path / "bkai", tmp_path / "o_bkai")
    want = np.zeros(HW, np.uint8)
    want[1:4, 1:5] = 1
    want[6:9, 6:10] = 2
    want[10, 0] = 1
    ds = load_prepared_dataset(tmp_path / "o_bkai", check_mask_values=True)
    assert ds.sample_ids == ["a"] and np.array_equal(read_mask(ds.mask_path("a")), want)
    rep = prepare_dataset("bkai-igh-neopolyp", tmp_path / "bkai", tmp_path / "o_bkai1", merge_polyp_classes=True)
    ds = load_prepared_dataset(tmp_path / "o_bkai1", check_mask_values=True)
    assert [c.name for c in ds.classes] == ["background", "polyp"]
    assert np.array_equal(read_mask(ds.mask_path("a")), np.where(want > 0, 255, 0))
    assert "colour rule classified 25 of 192 mask pixels" in rep.summary()  # 12 (254,0,0) + 12 (0,255,1) + 1


def test_busi_flat_and_class_folder_layouts_and_headline(tmp_path: Path) -> None:
    lesion = np.zeros(HW, bool)
    lesion[2:5, 2:6] = True
    extra = np.zeros(HW, bool)
    extra[8:10, 9:14] = True
    for root, img_dir, msk_dir in ((tmp_path / "flat", "images", "masks"),
                                   (tmp_path / "cls", "benign/images", "benign/mask")):
        _put(root / img_dir / "benign (1).png", _img(0))
        _put(root / msk_dir / "benign (1)_mask.png", (lesion * 255).astype(np.uint8))
        _put(root / msk_dir / "benign (1)_mask_1.png", (extra * 255).astype(np.uint8))
        _put(root / img_dir / "benign (2).png", _img(1))
        _put(root / msk_dir / "benign (2)_mask.png", (lesion * 255).astype(np.uint8))
        rep = prepare_dataset("busi", root, root.with_name(root.name + "_out"))
        ds = load_prepared_dataset(root.with_name(root.name + "_out"), check_mask_values=True)
        assert ds.sample_ids == ["benign (1)", "benign (2)"]
        assert np.array_equal(read_mask(ds.mask_path("benign (1)")), np.where(lesion | extra, 255, 0))
        assert rep.n_changed_mask_pixels == int(extra.sum()) == 10
        head = rep.summary().splitlines()[1]
        assert head.startswith("Merging the extra lesion mask files") and "added 10 lesion pixels" in head
        assert "binaris" not in head


# -------------------------------------------------------------------------------------- official layouts
def test_official_layouts_of_the_new_converters(tmp_path: Path) -> None:
    masks: dict = {}
    colon = tmp_path / "colon" / "CVC-ColonDB"  # frames <n>.tiff + masks p<n>.tiff + contours cp<n>.tiff
    for k, n in enumerate([39, 1, 301]):
        _pair(colon / f"{n}.tiff", colon / f"p{n}.tiff", k, masks, str(n))
        _put(colon / f"cp{n}.tiff", np.zeros(HW, np.uint8))
    rep = prepare_dataset("cvc-colondb", tmp_path / "colon", tmp_path / "o_colon")
    _check(tmp_path / "o_colon", masks, ["1", "39", "301"])
    ds = load_prepared_dataset(tmp_path / "o_colon")
    assert ds.index["group"].tolist() == ["seq1", "seq2", "seq4"]
    assert _sha(ds.image_path("39")) == _sha(colon / "39.tiff")
    assert rep.notes[0].startswith("layout: official") and any("ignored 3 other image file" in n for n in rep.notes)

    masks = {}
    etis = tmp_path / "etis"
    for k, n in enumerate([2, 1]):
        _pair(etis / "ETIS-LaribPolypDB" / f"{n}.tif", etis / "Ground Truth" / f"p{n}.tif", k, masks, str(n))
    prepare_dataset("etis-larib", etis, tmp_path / "o_etis")
    _check(tmp_path / "o_etis", masks, ["1", "2"])

    masks = {}
    cvc300 = tmp_path / "endoscene" / "CVC-300"
    for k, n in enumerate([149, 150]):
        _pair(cvc300 / "bbdd" / f"{n}.bmp", cvc300 / "gtpolyp" / f"{n}.bmp", k, masks, str(n))
    rep = prepare_dataset("cvc-300", tmp_path / "endoscene", tmp_path / "o_300")
    _check(tmp_path / "o_300", masks, ["149", "150"])
    assert any("come from CVC-ColonDB" in n for n in rep.notes)

    (etis / "Ground Truth" / "p2.tif").unlink()
    with pytest.raises(MSBError, match=r"1 frame\(s\) without a mask 'p<n>'.*2\.tif"):
        prepare_dataset("etis-larib", etis, tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


# ------------------------------------------------------------------------------------- groups CSV columns
def test_groups_csv_with_named_columns(tmp_path: Path) -> None:
    """The public CVC-ClinicDB copy: images/*.png + masks/*.png + a frame,sequence CSV."""
    masks: dict = {}
    for k in range(1, 5):
        _pair(tmp_path / "src/images" / f"{k}.png", tmp_path / "src/masks" / f"{k}.png", k, masks, str(k))
    g = tmp_path / "seq.csv"
    g.write_text("frame,sequence\n1,1\n2,1\n3,2\n004,2\n")
    with pytest.raises(MSBError, match=r"needs a key column 'sample_id' \(or 'image'\) and a group column 'group'; "
                                       r"found \['frame', 'sequence'\]\. Name the columns with --group-id-column"):
        prepare_dataset("cvc-clinicdb", tmp_path / "src", tmp_path / "bad", groups_csv=str(g))
    assert not (tmp_path / "bad").exists()
    prepare_dataset("cvc-clinicdb", tmp_path / "src", tmp_path / "out", groups_csv=str(g), group_id_column="frame",
                    group_column="sequence")
    assert load_prepared_dataset(tmp_path / "out").index["group"].tolist() == ["1", "1", "2", "2"]
    # the folder converter takes the same options (keys may be file names)
    g.write_text("file,patient\n1.png,p1\n3.png,p2\n")
    prepare_dataset("folder", tmp_path / "src", tmp_path / "fold", threshold=127, groups_csv=str(g),
                    group_id_column="file", group_column="patient")
    assert load_prepared_dataset(tmp_path / "fold").index["group"].tolist() == ["p1", "", "p2", ""]
    g.write_text("frame,sequence\n9,1\n")
    with pytest.raises(MSBError, match=r"line 2: frame '9' is not in the source"):
        prepare_dataset("cvc-colondb", tmp_path / "src", tmp_path / "bad", groups_csv=str(g),
                        group_id_column="frame", group_column="sequence")


# ------------------------------------------------------------------------------------------ noisy masks
def _noisy_folder(root: Path) -> None:
    rng = np.random.default_rng(0)
    for k in range(2):
        _put(root / "images" / f"{k}.png", _img(k))
        m = np.zeros(HW, np.uint8)
        m[3:8, 3:9] = 255
        m += rng.integers(0, 3, HW).astype(np.uint8) * (m == 0)  # faint noise 0..2 in the background
        _put(root / "masks" / f"{k}.png", m)


def test_folder_refuses_noisy_masks_without_threshold(tmp_path: Path) -> None:
    _noisy_folder(tmp_path / "src")
    with pytest.raises(MSBError, match=r"masks in .*/src/masks hold 4 distinct values \(0, 1, 2, 255\); a binary "
                                       r"mask has two\. Pass --threshold 127"):
        prepare_dataset("folder", tmp_path / "src", tmp_path / "out")
    assert not (tmp_path / "out").exists() and [p.name for p in tmp_path.iterdir()] == ["src"]
    with pytest.raises(MSBError, match=r"hold value\(s\) 1, 2 not in class_names \{255: 'lesion'\}"):
        prepare_dataset("folder", tmp_path / "src", tmp_path / "out", class_names={255: "lesion"})
    rep = prepare_dataset("folder", tmp_path / "src", tmp_path / "out", threshold=127)
    ds = load_prepared_dataset(tmp_path / "out", check_mask_values=True)
    assert [c.name for c in ds.classes] == ["background", "foreground"] and rep.n_samples == 2


def test_cli_prepare_groups_and_noisy_masks(tmp_path: Path) -> None:
    _noisy_folder(tmp_path / "src")
    (tmp_path / "seq.csv").write_text("frame,sequence\n0,s0\n1,s1\n")
    env = {"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}

    def msb(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "msb", "data", "prepare", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)

    r = msb("folder", "--source", "src", "--out", "o1")
    assert r.returncode == 2 and "hold 4 distinct values (0, 1, 2, 255)" in r.stderr
    assert "--threshold 127" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = msb("folder", "--source", "src", "--out", "o2", "--threshold", "127", "--groups", "seq.csv",
            "--group-id-column", "frame", "--group-column", "sequence")
    assert r.returncode == 0, r.stderr
    assert load_prepared_dataset(tmp_path / "o2").index["group"].tolist() == ["s0", "s1"]
