"""Converters for PraNet, CVC-ClinicDB (TIFF), ISIC 2018 Task 1, BUSI (real shared subset + built layout) and
BKAI-IGH NeoPolyp (colour masks), plus ``--source`` as ZIP / URL (loopback HTTP server on 127.0.0.1).

Sources are built by the tests in each dataset's layout; expected values are computed from the written source
pixels, independently of the converters. Every failing conversion must leave neither the output folder nor a
temporary sibling behind.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import os
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import cv2
import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image

from msb.data.converters import CONVERTERS, prepare_dataset
from msb.data.converters.fetch import prepare_from_source
from msb.data.schema import load_prepared_dataset, read_mask
from msb.errors import MSBError

REPO = Path(__file__).resolve().parents[2]
NEW = ("pranet", "cvc-clinicdb", "isic2018-task1", "busi", "bkai-igh-neopolyp")


def assert_clean(out: Path) -> None:
    assert not out.exists(), f"{out} left behind"
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")] == []


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def noisy_mask(hw: tuple[int, int], seed: int) -> np.ndarray:
    """Binary square with anti-aliased values on its rim (1, 100, 128, 129, 200, 254)."""
    rng = np.random.default_rng(seed)
    m = np.zeros(hw, np.uint8)
    m[4:14, 5:17] = 255
    rim = rng.choice([1, 100, 128, 129, 200, 254], size=12)
    m[3, 5:17] = rim
    return m


def img(hw: tuple[int, int], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, (*hw, 3), dtype=np.uint8)


def put(path: Path, arr: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr).save(path)


def changed(raw: np.ndarray, t: float) -> int:
    """Pixels whose value changes under 'value > t -> 255 else 0'."""
    out = np.where(raw > t, 255, 0)
    return int((out != raw).sum())


# ----------------------------------------------------------------------------------------------------- PraNet
def make_pranet(root: Path) -> dict[str, np.ndarray]:
    masks = {}
    hw = (20, 24)
    train = ["1", "2", "10", "cju30bmab08bi0835mvlr6e0r", "cju77k828z46w0871r0avuoo9", "cjuaaa"]
    for k, stem in enumerate(train):
        put(root / "TrainDataset/image" / f"{stem}.png", img(hw, k))
        masks[f"train/{stem}"] = noisy_mask(hw, k)
        put(root / "TrainDataset/mask" / f"{stem}.png", masks[f"train/{stem}"])
    for name, stems in (("CVC-300", ["1", "2"]), ("Kvasir", ["cjubbb"])):
        for k, stem in enumerate(stems):
            put(root / "TestDataset" / name / "images" / f"{stem}.png", img(hw, 50 + k))
            masks[f"{name}/{stem}"] = noisy_mask(hw, 50 + k)
            put(root / "TestDataset" / name / "masks" / f"{stem}.png", masks[f"{name}/{stem}"])
    return masks


def test_pranet_layout(tmp_path: Path) -> None:
    masks = make_pranet(tmp_path / "src")
    rep = prepare_dataset("pranet", tmp_path / "src", tmp_path / "out", val_fraction=0)
    ds = load_prepared_dataset(tmp_path / "out", check_mask_values=True)
    assert ds.sample_ids == ["train-CVC-ClinicDB-1", "train-CVC-ClinicDB-2", "train-CVC-ClinicDB-10",
                             "train-Kvasir-cju30bmab08bi0835mvlr6e0r", "train-Kvasir-cju77k828z46w0871r0avuoo9",
                             "train-Kvasir-cjuaaa", "test-CVC-300-1", "test-CVC-300-2", "test-Kvasir-cjubbb"]
    idx = ds.index.set_index("sample_id")
    assert idx.loc["test-CVC-300-1", "source"] == "CVC-300" and idx.loc["test-CVC-300-1", "split"] == "test"
    assert idx.loc["train-Kvasir-cjuaaa", "split"] == "train"
    assert idx.loc["train-Kvasir-cju30bmab08bi0835mvlr6e0r", "group"] == "kvasir-neardup_1" == \
        idx.loc["train-Kvasir-cju77k828z46w0871r0avuoo9", "group"]
    assert idx.loc["test-CVC-300-2", "image_path"] == "images/test/CVC-300/2.png"
    assert sha(ds.image_path("test-CVC-300-2")) == sha(tmp_path / "src/TestDataset/CVC-300/images/2.png")
    assert rep.n_changed_mask_pixels == sum(changed(m, 128) for m in masks.values()) > 0
    for key, m in masks.items():
        split, stem = key.split("/")
        sid = [s for s in ds.sample_ids if s.endswith(f"-{stem}") and (split == "train") == s.startswith("train")
               and (split == "train" or split in s)][0]
        assert np.array_equal(read_mask(ds.mask_path(sid)), np.where(m > 128, 255, 0))
    # default val_fraction=0.1: whole groups of the train rows move to val, deterministic
    prepare_dataset("pranet", tmp_path / "src", tmp_path / "v1")
    prepare_dataset("pranet", tmp_path / "src", tmp_path / "v2")
    v1 = load_prepared_dataset(tmp_path / "v1").index
    v2 = load_prepared_dataset(tmp_path / "v2").index
    assert v1.split.tolist() == v2.split.tolist()
    val = v1[v1.split == "val"]
    assert 1 <= len(val) <= 2 and val.sample_id.str.startswith("train-").all()
    assert (v1.split == "test").sum() == 3
    grp = v1[v1.group == "kvasir-neardup_1"].split
    assert grp.nunique() == 1


def test_pranet_test_folder_alone_and_errors(tmp_path: Path) -> None:
    make_pranet(tmp_path / "src")
    rep = prepare_dataset("pranet", tmp_path / "src" / "TestDataset", tmp_path / "t")
    assert rep.n_samples == 3 and set(load_prepared_dataset(tmp_path / "t").index.split) == {"test"}
    (tmp_path / "src/TestDataset/Unknown-Set/images").mkdir(parents=True)
    with pytest.raises(MSBError, match=r"unknown test set folder\(s\) \['Unknown-Set'\]"):
        prepare_dataset("pranet", tmp_path / "src", tmp_path / "bad")
    assert_clean(tmp_path / "bad")
    (tmp_path / "empty").mkdir()
    with pytest.raises(MSBError, match="no TrainDataset/"):
        prepare_dataset("pranet", tmp_path / "empty", tmp_path / "bad")
    assert_clean(tmp_path / "bad")


# ----------------------------------------------------------------------------------------------- CVC-ClinicDB
def make_cvc(root: Path, n: int = 12) -> dict[str, np.ndarray]:
    masks = {}
    for k in range(1, n + 1):
        put(root / "Original" / f"{k}.tif", img((18, 22), k))
        masks[str(k)] = noisy_mask((18, 22), k)
        put(root / "Ground Truth" / f"{k}.tif", masks[str(k)])
    return masks


def test_cvc_clinicdb_tiff(tmp_path: Path) -> None:
    masks = make_cvc(tmp_path / "src" / "TIF")
    rep = prepare_dataset("cvc-clinicdb", tmp_path / "src", tmp_path / "out")  # TIF/ wrapper entered
    ds = load_prepared_dataset(tmp_path / "out", check_mask_values=True)
    assert ds.sample_ids == [str(k) for k in range(1, 13)]  # numeric order, not 1, 10, 11, 12, 2
    assert rep.n_changed_mask_pixels == sum(changed(m, 127) for m in masks.values())
    assert ds.index.image_path.iloc[0] == "images/1.tif" and ds.index.source.eq("CVC-ClinicDB").all()
    assert sha(ds.image_path("7")) == sha(tmp_path / "src/TIF/Original/7.tif")
    assert np.array_equal(read_mask(ds.mask_path("10")), np.where(masks["10"] > 127, 255, 0))
    assert ds.index.group.eq("").all() and ds.index.split.eq("").all()
    g = tmp_path / "groups.csv"
    g.write_text("image,group\n1.tif,seq1\n2.tif,seq1\n3.tif,seq2\n")
    prepare_dataset("cvc-clinicdb", tmp_path / "src", tmp_path / "g", limit=4, groups_csv=str(g))
    assert load_prepared_dataset(tmp_path / "g").index.group.tolist() == ["seq1", "seq1", "seq2", ""]
    g.write_text("sample_id,group\n1,seq1\n99,seq9\n")
    with pytest.raises(MSBError, match=r"line 3: sample_id '99' is not in the source"):
        prepare_dataset("cvc-clinicdb", tmp_path / "src", tmp_path / "bad", groups_csv=str(g))
    assert_clean(tmp_path / "bad")
    (tmp_path / "src/TIF/Ground Truth/5.tif").unlink()
    with pytest.raises(MSBError, match=r"1 image\(s\) without a mask.*5.tif"):
        prepare_dataset("cvc-clinicdb", tmp_path / "src", tmp_path / "bad")
    assert_clean(tmp_path / "bad")


# ------------------------------------------------------------------------------------------------------ ISIC
def test_isic2018_task1(tmp_path: Path) -> None:
    src = tmp_path / "src"
    ids = {"train": ["ISIC_0000000", "ISIC_0000001", "ISIC_0000003"], "val": ["ISIC_0012255"]}
    folders = {"train": ("ISIC2018_Task1-2_Training_Input", "ISIC2018_Task1_Training_GroundTruth"),
               "val": ("ISIC2018_Task1-2_Validation_Input", "ISIC2018_Task1_Validation_GroundTruth")}
    for split, names in ids.items():
        inp, gt = folders[split]
        (src / inp).mkdir(parents=True)
        for k, name in enumerate(names):
            assert cv2.imwrite(str(src / inp / f"{name}.jpg"), img((16, 20), k))
            m = np.zeros((16, 20), np.uint8)
            m[2:9, 3:12] = 255
            put(src / gt / f"{name}_segmentation.png", m)
        (src / inp / "LICENSE.txt").write_text("CC-BY-NC\n")
        (src / inp / "ATTRIBUTION.txt").write_text("people\n")
    rep = prepare_dataset("isic2018-task1", src, tmp_path / "out")
    ds = load_prepared_dataset(tmp_path / "out", check_mask_values=True)
    assert ds.sample_ids == ids["train"] + ids["val"]
    assert ds.index.split.tolist() == ["train"] * 3 + ["val"]
    assert rep.n_changed_mask_pixels == 0 and rep.notes[0] == "phases: train=3, val=1"
    assert (tmp_path / "out/licences/ISIC2018_Task1-2_Training_Input_LICENSE.txt").read_text() == "CC-BY-NC\n"
    assert ds.index.image_path.iloc[3] == "images/val/ISIC_0012255.jpg"
    assert sha(ds.image_path("ISIC_0000001")) == sha(src / folders["train"][0] / "ISIC_0000001.jpg")
    (src / "ISIC2018_Task1-2_Test_Input").mkdir()
    with pytest.raises(MSBError, match="found ISIC2018_Task1-2_Test_Input/ but not ISIC2018_Task1_Test_GroundTruth/"):
        prepare_dataset("isic2018-task1", src, tmp_path / "bad")
    assert_clean(tmp_path / "bad")


# ------------------------------------------------------------------------------------------------------ BUSI
def make_busi(root: Path) -> dict[str, list[np.ndarray]]:
    """Official layout: class folders, masks beside images, 1-bit / RGB / RGBA encodings, several per image."""
    base = root / "Dataset_BUSI_with_GT"
    hw = (20, 30)
    masks: dict[str, list[np.ndarray]] = {}

    def lesion(r0: int, c0: int) -> np.ndarray:
        m = np.zeros(hw, bool)
        m[r0:r0 + 6, c0:c0 + 8] = True
        return m

    spec = {"benign (1)": [lesion(2, 2)], "benign (2)": [lesion(2, 2), lesion(5, 6), lesion(12, 18)],
            "benign (10)": [lesion(8, 8)], "malignant (2)": [lesion(3, 10)], "malignant (145)": [lesion(1, 1)],
            "normal (2)": [np.zeros(hw, bool)]}
    for stem, ms in spec.items():
        cls = stem.split(" ")[0]
        put(base / cls / f"{stem}.png", img(hw, len(masks)))
        masks[stem] = ms
        for j, m in enumerate(ms):
            name = f"{stem}_mask.png" if j == 0 else f"{stem}_mask_{j}.png"
            path = base / cls / name
            if cls == "normal":
                Image.fromarray(np.zeros((*hw, 3), np.uint8)).save(path)  # RGB all zero
            elif stem == "malignant (2)":
                rgba = np.dstack([m.astype(np.uint8) * 255] * 3 + [np.full(hw, 255, np.uint8)])
                Image.fromarray(rgba, "RGBA").save(path)
            else:
                Image.fromarray(m).convert("1").save(path)  # 1-bit
    (base / "benign" / "notes.txt").write_text("ignored")
    return masks


def test_busi_official_layout_union(tmp_path: Path) -> None:
    masks = make_busi(tmp_path / "src")
    rep = prepare_dataset("busi", tmp_path / "src", tmp_path / "out")
    ds = load_prepared_dataset(tmp_path / "out", check_mask_values=True)
    assert ds.sample_ids == ["benign (1)", "benign (2)", "benign (10)", "malignant (2)", "normal (2)"]
    assert ds.index.set_index("sample_id").diagnosis.to_dict() == {
        "benign (1)": "benign", "benign (2)": "benign", "benign (10)": "benign", "malignant (2)": "malignant",
        "normal (2)": "normal"}
    for sid, ms in masks.items():
        if sid == "malignant (145)":
            continue
        union = np.logical_or.reduce(ms)
        assert np.array_equal(read_mask(ds.mask_path(sid)), np.where(union, 255, 0)), sid
    ms = masks["benign (2)"]
    assert rep.n_changed_mask_pixels == int((np.logical_or.reduce(ms) & ~ms[0]).sum()) == (6 * 8 - 3 * 4) + 6 * 8  # overlap rows 5-7 x cols 6-9
    assert any("dropped 1 of the 19 images" in n and "malignant (145)" in n for n in rep.notes)
    assert any(n.startswith("1 image(s) have several mask files") for n in rep.notes)
    assert read_mask(ds.mask_path("normal (2)")).max() == 0
    rep2 = prepare_dataset("busi", tmp_path / "src", tmp_path / "all", exclude_label_conflicts=False, limit=2)
    assert rep2.n_samples == 2
    (tmp_path / "src/Dataset_BUSI_with_GT/benign/benign (7)_mask.png").write_bytes(
        (tmp_path / "src/Dataset_BUSI_with_GT/benign/benign (1)_mask.png").read_bytes())
    with pytest.raises(MSBError, match=r"1 mask\(s\) without an image: benign \(7\)_mask.png"):
        prepare_dataset("busi", tmp_path / "src", tmp_path / "bad")
    assert_clean(tmp_path / "bad")


@pytest.mark.shared_data
def test_busi_real_shared_subset(tmp_path: Path, shared_dir: Path) -> None:
    src = shared_dir / "data" / "busi"
    if not src.is_dir():
        pytest.skip(f"{src} not found")
    rep = prepare_dataset("busi", src, tmp_path / "busi")
    ds = load_prepared_dataset(tmp_path / "busi", check_mask_values=True)
    ref = pd.read_csv(src / "index.csv", dtype=str, keep_default_na=False)
    assert len(ds) == len(ref) == 175
    assert ds.index.diagnosis.value_counts().to_dict() == {"benign": 100, "malignant": 50, "normal": 25}
    groups = dict(zip(ds.index.sample_id, ds.index.group))
    assert all(groups[name[:-4]] == g for name, g in zip(ref.image, ref.near_dup_group))
    extra = 0
    for r in ref.itertuples():
        files = r.masks.split(";")
        fg = [np.asarray(Image.open(src / "masks" / f).convert("L")) > 0 for f in files]
        union = np.logical_or.reduce(fg)
        extra += int((union & ~fg[0]).sum())
        if len(files) > 1:
            assert np.array_equal(read_mask(ds.mask_path(r.image[:-4])) == 255, union)
    assert rep.n_changed_mask_pixels == extra > 0
    assert sum(1 for r in ref.itertuples() if ";" in r.masks) == 6


# ------------------------------------------------------------------------------------------------------ BKAI
def test_bkai_colour_masks(tmp_path: Path) -> None:
    src = tmp_path / "src"
    hw = (16, 20)
    exact = np.zeros((*hw, 3), np.uint8)
    exact[2:6, 2:8] = (255, 0, 0)
    exact[8:12, 10:16] = (0, 255, 0)
    exact[0, 0] = (200, 180, 0)  # both on, R >= G -> neoplastic (ambiguous)
    exact[0, 1] = (150, 220, 10)  # both on, G > R -> non-neoplastic (ambiguous)
    exact[0, 2] = (90, 30, 250)  # nothing above 127 in R/G -> background
    put(src / "train/train/a1.jpeg", img(hw, 0))
    put(src / "train_gt/train_gt/a1.png", exact)
    put(src / "train/train/a2.jpeg", img(hw, 1))
    cv2.imwrite(str(src / "train_gt/train_gt/a2.jpeg"), exact[:, :, ::-1], [cv2.IMWRITE_JPEG_QUALITY, 70])
    put(src / "test/test/t1.jpeg", img(hw, 2))
    rep = prepare_dataset("bkai-igh-neopolyp", src, tmp_path / "out")
    ds = load_prepared_dataset(tmp_path / "out", check_mask_values=True)
    assert [(c.class_id, c.name, c.source_values) for c in ds.classes] == [
        (0, "background", (0,)), (1, "neoplastic", (1,)), (2, "non_neoplastic", (2,))]
    want = np.zeros(hw, np.uint8)
    want[2:6, 2:8] = 1
    want[8:12, 10:16] = 2
    want[0, 0], want[0, 1] = 1, 2
    assert np.array_equal(read_mask(ds.mask_path("a1")), want)
    onehot = ds.load_onehot("a1")
    assert onehot.shape == (2, *hw) and int(onehot[0].sum()) == 25 and int(onehot[1].sum()) == 25
    # JPEG mask: expected labels computed from its decoded pixels with the documented rule
    rgb = np.asarray(Image.open(src / "train_gt/train_gt/a2.jpeg").convert("RGB")).astype(int)
    r, g = rgb[..., 0], rgb[..., 1]
    exp = np.where((r > 127) & ((g <= 127) | (r >= g)), 1, np.where(g > 127, 2, 0))
    assert np.array_equal(read_mask(ds.mask_path("a2")), exp)
    pure = np.zeros(hw, bool)
    for col in ((0, 0, 0), (255, 0, 0), (0, 255, 0)):
        pure |= np.all(rgb == col, axis=-1)
    assert rep.n_changed_mask_pixels == 3 + int((~pure).sum())
    assert any("skipped 1 test image(s)" in n for n in rep.notes)
    (src / "train_gt").rename(src / "gt")
    with pytest.raises(MSBError, match=r"needs train/ \(images\) and train_gt/"):
        prepare_dataset("bkai-igh-neopolyp", src, tmp_path / "bad")
    assert_clean(tmp_path / "bad")


# ---------------------------------------------------------------------------------------- --source ZIP / URL
def make_kvasir_zip(tmp_path: Path) -> Path:
    root = tmp_path / "raw" / "Kvasir-SEG"
    for k in range(3):
        put(root / "images" / f"id{k}.jpg", img((12, 14), k))
        m = np.zeros((12, 14), np.uint8)
        m[2:8, 3:9] = 255
        put(root / "masks" / f"id{k}.jpg", np.dstack([m] * 3))
    z = tmp_path / "kvasir-seg.zip"
    with zipfile.ZipFile(z, "w") as zf:
        for p in sorted(root.rglob("*")):
            zf.write(p, p.relative_to(root.parent).as_posix())
        zf.writestr("__MACOSX/._junk", b"x")
    return z


@pytest.fixture()
def http_server(tmp_path: Path):
    """A loopback HTTP server (127.0.0.1, free port) serving ``tmp_path/www``."""
    www = tmp_path / "www"
    www.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(www))
    handler.log_message = lambda *a, **k: None
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield www, f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_source_zip_and_url(tmp_path: Path, http_server) -> None:
    z = make_kvasir_zip(tmp_path)
    rep = prepare_from_source("kvasir-seg", str(z), tmp_path / "from_zip")
    assert rep.n_samples == 3
    assert any(f"sha256 {sha(z)}" in n for n in rep.notes)
    www, base = http_server
    (www / "kvasir-seg.zip").write_bytes(z.read_bytes())
    rep = prepare_from_source("kvasir-seg", f"{base}/kvasir-seg.zip", tmp_path / "from_url")
    assert rep.n_samples == 3 and any(f"downloaded from {base}/kvasir-seg.zip" in n and sha(z) in n
                                      for n in rep.notes)
    a, b = load_prepared_dataset(tmp_path / "from_zip"), load_prepared_dataset(tmp_path / "from_url")
    assert all(sha(a.image_path(s)) == sha(b.image_path(s)) for s in a.sample_ids)
    leftovers = [p for p in Path(os.environ.get("TMPDIR", "/tmp")).glob("msb-source-*")]
    assert not any(str(tmp_path) in str(p) for p in leftovers)
    with pytest.raises(MSBError, match="HTTP 404"):
        prepare_from_source("kvasir-seg", f"{base}/missing.zip", tmp_path / "bad")
    assert_clean(tmp_path / "bad")
    (www / "notzip.bin").write_bytes(b"plain bytes")
    with pytest.raises(MSBError, match="not a ZIP or tar archive"):
        prepare_from_source("kvasir-seg", f"{base}/notzip.bin", tmp_path / "bad")
    assert_clean(tmp_path / "bad")


def test_unsafe_zip_refused(tmp_path: Path) -> None:
    z = tmp_path / "evil.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("ok/images/a.jpg", b"x")
        zf.writestr("../escape.txt", b"x")
    with pytest.raises(MSBError, match=r"archive member '../escape.txt' would be written outside"):
        prepare_from_source("kvasir-seg", str(z), tmp_path / "bad")
    assert_clean(tmp_path / "bad")
    assert not (tmp_path.parent / "escape.txt").exists()
    with pytest.raises(MSBError, match="no such folder or file"):
        prepare_from_source("kvasir-seg", str(tmp_path / "nope.zip"), tmp_path / "bad")


def test_cli_prepare_from_zip_with_option(tmp_path: Path) -> None:
    z = make_kvasir_zip(tmp_path)
    env = dict(os.environ, HF_HUB_OFFLINE="1", COLUMNS="200")
    r = subprocess.run([sys.executable, "-m", "msb", "data", "prepare", "kvasir-seg", "--source", str(z), "--out",
                        str(tmp_path / "o"), "--option", "threshold=100"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Prepared 3 sample(s)" in r.stdout and "value > 100" in " ".join(r.stdout.split())
    r = subprocess.run([sys.executable, "-m", "msb", "data", "prepare", "kvasir-seg", "--source", str(z), "--out",
                        str(tmp_path / "o2"), "--option", "threshold"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2 and "expected KEY=VALUE" in r.stderr and not (tmp_path / "o2").exists()


# ------------------------------------------------------------------------------------------- registry + cards
def test_registry_and_cards() -> None:
    assert set(NEW) <= set(CONVERTERS)
    for name, card_file in (("pranet", "pranet_polyp"), ("cvc-clinicdb", "cvc_clinicdb"),
                            ("isic2018-task1", "isic2018_task1"), ("busi", "busi"),
                            ("bkai-igh-neopolyp", "bkai_igh_neopolyp")):
        card = yaml.safe_load((REPO / "datasets" / f"{card_file}.yaml").read_text())
        assert card["converter"] == name
        assert card["official_url"].startswith("https://") and card["citation"] and card["licence"]
    doc = (REPO / "docs" / "datasets.md").read_text()
    for name in NEW:
        assert f"`{name}`" in doc
