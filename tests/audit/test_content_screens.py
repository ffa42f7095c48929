"""Screens on the content, not the frame (``msb audit --fov``), calibration on known groups, clusters joining groups.

Frames built here from ``../shared`` CVC-ColonDB images (issue 31's endoscopy case, rebuilt): six "videos", each
the central crop of one frame of a different CVC sequence (standardised to grey mean 120, std 35 per channel).
Every video has four frames: three under border A (black frame with cut corners and a white overlay box with
text, shared by 3/4 of the frames) -- the content as is, 6 grey levels brighter, with Gaussian noise (sigma 3) --
and one under border B (a different black frame, no overlay). Same video = same content; different videos =
different content.

Independent references: NCC recomputed with ``np.corrcoef`` on area-mean thumbnails of PIL's grey image, each
pixel the exact mean of its cell computed by repeating every pixel 64 times along each axis and summing blocks
(a plain loop over all 276 pairs); masked NCC/SSIM against NumPy/skimage loops on random arrays.
"""

from __future__ import annotations

import json
from itertools import combinations
from pathlib import Path

import cv2
import numpy as np
import pandas as pd
import pytest
from PIL import Image
from skimage.metrics import structural_similarity
from typer.testing import CliRunner

from msb.audit.content import estimate_fov
from msb.audit.core import AuditConfig, run_audit
from msb.audit.screens import SSIM_PARAMS, ncc_all_pairs, ncc_pairs, ssim_pairs
from msb.cli.app import app
from msb.data.schema import ClassSpec, write_prepared_dataset
from msb.errors import MSBError

H, W = 160, 192
R0, R1, C0, C1 = 16, 144, 40, 184  # content window
SEQUENCES = (1, 2, 3, 4, 6, 9)


def _content(src: Path) -> np.ndarray:
    im = cv2.imread(str(src))[100:400, 120:460]
    im = cv2.resize(im, (C1 - C0, R1 - R0), interpolation=cv2.INTER_AREA).astype(np.float64)
    return np.clip((im - im.mean()) / im.std() * 35 + 120, 0, 255).astype(np.uint8)


def _frame_a(c: np.ndarray) -> np.ndarray:
    f = np.zeros((H, W, 3), np.uint8)
    f[R0:R1, C0:C1] = c
    for r in range(20):  # cut corners
        k = 20 - r
        for row in (R0 + r, R1 - 1 - r):
            f[row, C0:C0 + k] = 0
            f[row, C1 - k:C1] = 0
    f[8:64, 4:34] = 225  # overlay box with text
    cv2.putText(f, "ID", (6, 30), cv2.FONT_HERSHEY_SIMPLEX, 0.5, (40, 40, 40), 1)
    cv2.putText(f, "07", (6, 52), cv2.FONT_HERSHEY_SIMPLEX, 0.5, (40, 40, 40), 1)
    return f


def _frame_b(c: np.ndarray) -> np.ndarray:
    f = np.zeros((H, W, 3), np.uint8)
    f[R0:R1, C0:C1] = c
    f[:, :C0 + 12] = 0
    f[:, C1 - 10:] = 0
    f[:R0 + 8] = 0
    return f


@pytest.fixture(scope="module")
def framed(shared_dir: Path, tmp_path_factory) -> Path:
    src = shared_dir / "data" / "cvc-colondb"
    if not (src / "index.csv").is_file():
        pytest.skip(f"{src}: the shared CVC-ColonDB is needed")
    idx = pd.read_csv(src / "index.csv")
    root = tmp_path_factory.mktemp("framed") / "ds"
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    rows = []
    for v, seq in enumerate(SEQUENCES):
        c = _content(src / idx[idx["sequence"] == seq]["image"].iat[0])
        noise = np.random.default_rng(v).normal(0, 3, c.shape)
        frames = {"a1": _frame_a(c), "a2": _frame_a(np.clip(c.astype(int) + 6, 0, 255).astype(np.uint8)),
                  "a3": _frame_a(np.clip(c + noise, 0, 255).astype(np.uint8)), "b": _frame_b(c)}
        for k, f in frames.items():
            sid = f"v{v}_{k}"
            assert cv2.imwrite(str(root / "images" / f"{sid}.png"), f)
            m = np.zeros((H, W), np.uint8)
            m[60:90, 80:120] = 255
            assert cv2.imwrite(str(root / "masks" / f"{sid}.png"), m)
            rows.append({"sample_id": sid, "image_path": f"images/{sid}.png", "mask_path": f"masks/{sid}.png",
                         "split": "", "group": f"video{v}", "height": H, "width": W, "source": "framed"})
    write_prepared_dataset(root, pd.DataFrame(rows), [ClassSpec(0, "background", (0,)), ClassSpec(1, "polyp", (255,))])
    return root


def area_mean_by_repetition(grey: np.ndarray, size: int) -> np.ndarray:
    """Independent area-mean thumbnail: each pixel repeated ``size`` times along both axes, so cell ``(r, c)`` is a
    block of ``H x W`` samples; the block sums (integers) over ``H W``, rounded half to even (``np.round`` of the
    exact fraction: a tie ``k + 1/2`` is a float exactly)."""
    h, w = grey.shape
    rows = np.repeat(grey.astype(np.int64), size, axis=0).reshape(size, h, w).sum(axis=1)  # (size, w)
    sums = np.repeat(rows, size, axis=1).reshape(size, size, w).sum(axis=2)  # (size, size)
    return np.round(sums / (h * w)).astype(np.uint8)


def _whole_frame_ncc(root: Path) -> dict[tuple[str, str], float]:
    """Independent: Pearson correlation of 64x64 area-mean thumbnails of PIL's grey image, every pair."""
    ids = sorted(p.stem for p in (root / "images").glob("*.png"))
    th = {s: area_mean_by_repetition(np.asarray(Image.open(root / "images" / f"{s}.png").convert("L")), 64)
          .astype(float).ravel() for s in ids}
    return {(a, b): float(np.corrcoef(th[a], th[b])[0, 1]) for a, b in combinations(ids, 2)}


def _video(sid: str) -> str:
    return sid.split("_")[0]


def _confirmed(result) -> set[tuple[str, str]]:
    p = result.pairs[result.pairs["confirmed"]]
    return {tuple(sorted((a, b))) for a, b in zip(p["sample_id_a"], p["sample_id_b"])}


def test_masked_screens_match_numpy_loops() -> None:
    rng = np.random.default_rng(3)
    base = rng.integers(0, 256, (16, 16)).astype(float)
    thumbs = np.clip(base[None] + rng.normal(0, 25, (6, 16, 16)), 0, 255).astype(np.uint8)
    masks = rng.random((6, 16, 16)) > 0.3
    masks[5] = False
    masks[5, :3] = True  # 48 pixels: overlaps below min_overlap(16) = 51 -> NaN
    i, j = np.array([a for a, b in combinations(range(6), 2)]), np.array([b for a, b in combinations(range(6), 2)])
    got = ncc_pairs(thumbs, i, j, masks=masks)
    for t, (a, b) in enumerate(zip(i, j)):
        m = masks[a] & masks[b]
        if m.sum() < 51:
            assert np.isnan(got[t])
        else:
            assert got[t] == pytest.approx(np.corrcoef(thumbs[a][m].astype(float), thumbs[b][m].astype(float))[0, 1],
                                           abs=1e-12)
    cut = float(np.nanmedian(got))
    ai, aj = ncc_all_pairs(thumbs, cut, masks=masks, margin=1e-9)
    want = {(int(a), int(b)) for a, b, v in zip(i, j, got) if not np.isnan(v) and v >= cut - 1e-9}
    assert set(zip(ai.tolist(), aj.tolist())) == want
    s = ssim_pairs(thumbs, np.array([0]), np.array([1]), masks=masks)[0]
    _, smap = structural_similarity(thumbs[0], thumbs[1], full=True, **SSIM_PARAMS)
    inner = (masks[0] & masks[1])[3:-3, 3:-3]
    assert s == pytest.approx(smap[3:-3, 3:-3][inner].mean(), abs=1e-12)


def test_estimate_fov_leaves_out_a_border_shared_by_most_images() -> None:
    rng = np.random.default_rng(0)
    thumbs = rng.integers(40, 256, (12, 32, 32)).astype(np.uint8)
    thumbs[:9, :, :4] = 0  # black band in 9 of 12 images: 3/4 >= 2/3 -> constant
    thumbs[:9, :6, 10:20] = 230  # overlay box
    fov = estimate_fov(thumbs)
    left = np.zeros((32, 32), bool)
    left[:, :4] = True
    left[:6, 10:20] = True
    grown = cv2.dilate(left.astype(np.uint8), np.ones((3, 3), np.uint8)).astype(bool)
    assert (~fov.mask == grown).all()
    assert fov.left_out_fraction == pytest.approx(grown.mean())
    few = estimate_fov(thumbs[:3])  # fewer than 4 images: nothing estimated, and said so
    assert few.mask.all() and few.left_out_fraction == 0.0 and few.notes


@pytest.mark.shared_data
def test_same_content_under_two_borders_is_confirmed_different_content_under_one_border_is_not(framed) -> None:
    ref = _whole_frame_ncc(framed)
    cross_ref = {k for k, v in ref.items() if _video(k[0]) != _video(k[1]) and v >= 0.95}
    assert len(cross_ref) >= 10  # precondition: the shared border and overlay make different videos look alike
    ab = [(f"v{v}_a1", f"v{v}_b") for v in range(6)]
    assert min(ref[p] for p in ab) < 0.8  # and two borders make the same content look different

    content = run_audit(framed)
    within = {tuple(sorted(p)) for v in range(6)
              for p in combinations([f"v{v}_{k}" for k in ("a1", "a2", "a3", "b")], 2)}
    assert _confirmed(content) == within  # all 36 same-content pairs, no pair of two videos
    assert content.params["fov"]["left_out_fraction"] > 0.3

    frame = run_audit(framed, config=AuditConfig(fov="none"))
    cross = {p for p in _confirmed(frame) if _video(p[0]) != _video(p[1])}
    assert cross == cross_ref  # the whole-frame screen: exactly the reference's cross-video pairs


def _split(framed: Path, path: Path, assign) -> Path:
    ids = pd.read_csv(framed / "index.csv")["sample_id"]
    pd.DataFrame({"sample_id": ids, "split": [assign(s) for s in ids]}).to_csv(path, index=False)
    return path


def _audit(*args: str):
    return CliRunner().invoke(app, ["audit", *args, "--format", "table"], env={"COLUMNS": "200"})


@pytest.mark.shared_data
def test_video_split_passes_random_split_fails(framed: Path, tmp_path: Path) -> None:
    grouped = _split(framed, tmp_path / "g.csv", lambda s: "test" if _video(s) in ("v1", "v4") else "train")
    rng = np.random.default_rng(0)
    draw = {s: ("test" if x < 0.3 else "train") for s, x in
            zip(pd.read_csv(framed / "index.csv")["sample_id"], rng.random(24))}
    rnd = _split(framed, tmp_path / "r.csv", draw.get)
    assert any(len({draw[f"v{v}_{k}"] for k in ("a1", "a2", "a3", "b")}) == 2 for v in range(6))  # a video is cut
    r = _audit(str(framed), "--split-file", str(grouped), "--out", str(tmp_path / "g"), "--fail-on",
               "crossing-near-duplicate")
    assert r.exit_code == 0, r.stdout
    assert r.stdout.strip().splitlines()[-1] == ("audit verdict: PASS — 0 of 6 near-duplicate groups cross the "
                                                 "split, 0 of 24 rows [crossing-near-duplicate]")
    r = _audit(str(framed), "--split-file", str(rnd), "--out", str(tmp_path / "r"), "--fail-on",
               "crossing-near-duplicate")
    assert r.exit_code == 3, r.stdout
    v = json.loads((tmp_path / "r" / "verdict.json").read_text())
    check = next(c for c in v["checks"] if c["check"] == "crossing-near-duplicate")
    frames = ("a1", "a2", "a3", "b")
    cut_pairs = sum(sum(draw[f"v{k}_{x}"] == "train" for x in frames) * sum(draw[f"v{k}_{x}"] == "test" for x in frames)
                    for k in range(6))  # one near-duplicate group per video: its train x test row pairs
    assert check["crossing_pairs"] == cut_pairs > 0 and check["pairs_in_groups"] == 36
    assert v["predicate"]["thresholds"]["ncc_min"] == 0.95 and v["predicate"]["cross_group_pairs"] == 0
    assert v["predicate"]["within_group_pairs"] == 36 and v["predicate"]["within_group_denominator"] == 36
    assert v["predicate"]["fov"]["mode"] == "auto" and (tmp_path / "r" / "fov_mask.png").is_file()


@pytest.mark.shared_data
def test_whole_frame_audit_names_the_clusters_that_join_videos(framed: Path, tmp_path: Path) -> None:
    ref = _whole_frame_ncc(framed)
    cross = {k: v for k, v in ref.items() if _video(k[0]) != _video(k[1]) and v >= 0.95}
    out = tmp_path / "a"
    r = _audit(str(framed), "--fov", "none", "--out", str(out), "--calibrate")
    assert r.exit_code == 0, r.stdout
    v = json.loads((out / "verdict.json").read_text())
    assert v["predicate"]["cross_group_pairs"] == len(cross)
    assert v["predicate"]["cross_group_denominator"] == 24 * 23 // 2 - 6 * 6
    assert v["group_links"]["cross_group_pairs"] == len(cross)
    ncc_range = next(c for c in v["predicate"]["calibration"] if c["screen"] == "ncc")
    edge = max(v_ for k, v_ in ref.items() if _video(k[0]) != _video(k[1]))
    assert ncc_range["edge"] == pytest.approx(edge, abs=1e-6) and f"ncc > {edge:.4f}" in r.stdout
    assert "warning: " + str(len(cross)) + " confirmed pair(s) link different groups" in r.stdout
    html = (out / "contact_sheet.html").read_text()
    a, b = max(cross, key=cross.get)
    assert html.index("Clusters that join several groups") < html.index("<h2>Census")
    assert f"{a} (video{a[1]}) - {b} (video{b[1]})" in html
    links = pd.read_csv(out / "group_links.csv")
    assert {tuple(sorted(p)) for p in zip(links["key_a"], links["key_b"])} == set(cross)
    preds = pd.read_csv(out / "predicates.csv").set_index("predicate")
    assert preds.loc["strict", "cross_group_pairs"] == sum(x >= 0.99 for x in cross.values())


@pytest.mark.shared_data
def test_apply_clusters_follows_a_cross_group_link_only_when_accepted(framed: Path, tmp_path: Path) -> None:
    ref = _whole_frame_ncc(framed)
    a, b = max((k for k in ref if _video(k[0]) != _video(k[1])), key=ref.get)
    r = _audit(str(framed), "--fov", "none", "--out", str(tmp_path / "a"), "--apply-clusters", "--curated-out",
               str(tmp_path / "c1"))
    assert r.exit_code == 0, r.stdout
    groups = pd.read_csv(tmp_path / "c1" / "index.csv", keep_default_na=False).set_index("sample_id")["group"]
    by_video = {v: set(groups[[s for s in groups.index if _video(s) == f"v{v}"]]) for v in range(6)}
    assert all(len(g) == 1 for g in by_video.values()) and groups.nunique() == 6  # no video merged through a link
    dec = tmp_path / "dec.csv"
    dec.write_text(f"sample_id,action,reason,target\n{a},group,same scene,accepted\n{b},group,same scene,accepted\n")
    r = _audit(str(framed), "--fov", "none", "--out", str(tmp_path / "b"), "--apply-clusters", "--apply", str(dec),
               "--curated-out", str(tmp_path / "c2"))
    assert r.exit_code == 0, r.stdout
    groups = pd.read_csv(tmp_path / "c2" / "index.csv", keep_default_na=False).set_index("sample_id")["group"]
    assert groups.nunique() == 5 and groups[a] == groups[b]
    assert set(groups[[s for s in groups.index if _video(s) in (_video(a), _video(b))]]) == {groups[a]}


def test_fov_mask_file_is_used_recorded_and_written(planted: Path, tmp_path: Path) -> None:
    mask = np.zeros((50, 80), np.uint8)
    mask[:, 40:] = 255  # right half = content
    assert cv2.imwrite(str(tmp_path / "m.png"), mask)
    out = tmp_path / "a"
    r = _audit(str(planted), "--fov", str(tmp_path / "m.png"), "--out", str(out))
    assert r.exit_code == 0, r.stdout
    fov = json.loads((out / "audit.json").read_text())["fov"]
    assert fov["mode"] == "file" and fov["left_out_fraction"] == 0.5 and not fov["per_image"]
    written = cv2.imread(str(out / "fov_mask.png"), cv2.IMREAD_GRAYSCALE)
    want = cv2.resize(mask, (64, 64), interpolation=cv2.INTER_NEAREST)
    assert (written == want).all()
    assert "screens on the content (--fov file): 50.0 % of the thumbnail pixels left out" in r.stdout
    pairs = pd.read_csv(out / "pairs.csv")  # byte copies stay confirmed, with NCC 1 on the content half
    assert pairs.set_index(["sample_id_a", "sample_id_b"]).loc[("a", "copy_a"), "ncc"] == pytest.approx(1.0)
    r = _audit(str(planted), "--fov", str(tmp_path / "missing.png"), "--out", str(out))
    assert isinstance(r.exception, MSBError) and "--fov must be auto, none or a mask image file" in str(r.exception)


def test_content_crop_hashes_equal_imagehash_of_the_crop(shared_dir: Path) -> None:
    """The content hashes (batched path) against imagehash itself on the crop cut by hand: a dataset mask that
    leaves out the top quarter (rows 0-15 of 64) crops each image to rows ``floor(h / 4)`` .. ``h``."""
    import imagehash

    from msb.audit.content import FovMask, content_fingerprints

    files = sorted(p for p in (shared_dir / "data").glob("*/images/*") if p.suffix.lower() in {".jpg", ".png"})
    if not files:
        pytest.skip(f"no images under {shared_dir / 'data'}")
    files = files[::151][:8]
    mask = np.ones((64, 64), bool)
    mask[:16] = False
    table = content_fingerprints(files, FovMask("file", mask, left_out_fraction=0.25), 64, workers=2)
    for p, ph, dh in zip(files, table.phash, table.dhash):
        grey = Image.open(p).convert("L")
        crop = grey.crop((0, grey.height * 16 // 64, grey.width, grey.height))
        assert f"{int(ph):016x}" == str(imagehash.phash(crop)), p
        assert f"{int(dh):016x}" == str(imagehash.dhash(crop)), p
