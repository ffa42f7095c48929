"""``msb run configs/protocols/msb_case_study_paper_ci_cohort.yaml`` end to end (issue 32): the MSB paper's eleven
architectures, full size, each at the smallest input it takes (``architecture_overrides``: 32 px; 64 px for CENet
and TransNeXt; 128 px for the VWFormers), one epoch on a handful of synthetic NeoPolyp-like frames (background +
2 classes), CPU. Checked from the stored files: every architecture has a run at its size whose counts file holds
one row per test image x foreground class, with tp / fp / fn / tn recounted here from the stored prediction mask
against the dataset's own mask PNG (class id = pixel value, classes.csv); the closing leaderboard lists all
eleven, with image-macro Dice recomputed from the counts."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image

REPO = Path(__file__).resolve().parents[2]
STUDY_FILE = REPO / "configs" / "protocols" / "msb_case_study_paper_ci_cohort.yaml"
#: the paper's cohort (section 4.1, Table 3) -> the input size the study gives it (px)
SIZES = {"unet_classic": 32, "missformer": 32, "hiformer_b": 32, "segformer_b3": 32, "segnext_l": 32,
         "vwformer_mit_b3": 128, "cenet_pvt_b3": 64, "vwformer_convnext_s": 128, "transnext_t_uper": 64,
         "internimage_t_uper": 32, "swin_umamba": 32}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cohort(tmp_path_factory) -> tuple[Path, Path, str]:
    """Run the study in a temporary folder (datasets/ and runs/ are created there, never in the repo); returns
    (study folder, dataset root, stdout of ``msb run --format csv``)."""
    work = tmp_path_factory.mktemp("paper_ci_cohort")
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", COLUMNS="200",
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "msb", "run", str(STUDY_FILE), "--run-root", str(work / "runs"),
                        "--format", "csv"], cwd=work, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    print(f"msb run {STUDY_FILE.name}: {time.perf_counter() - t0:.0f} s wall")
    return work / "runs" / "msb_case_study_paper_ci_cohort", work / "datasets" / "synthetic_ci_neopolyp_cohort", \
        r.stdout


def _runs(study: Path) -> dict[str, Path]:
    """Architecture -> its run folder (``<dataset>-<architecture>-<hash>``)."""
    out = {}
    for run in sorted(study.glob("synthetic_ci_neopolyp_cohort-*")):
        arch = run.name.split("-")[1]
        assert arch not in out, f"two runs of {arch}"
        out[arch] = run
    return out


def test_every_architecture_ran_at_its_size(cohort):
    study, _, _ = cohort
    runs = _runs(study)
    assert sorted(runs) == sorted(SIZES)
    for arch, run in runs.items():
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        assert cfg["model"]["arch"] == arch
        assert cfg["data"]["input_size"] == [SIZES[arch], SIZES[arch]], arch
        assert cfg["train"]["epochs"] == 1 and cfg["train"]["device"] == "cpu"
        if arch in ("hiformer_b", "transnext_t_uper"):  # built for one size: the study sets it with the input
            assert list(np.atleast_1d(cfg["model"]["params"]["img_size"]))[:1] == [SIZES[arch]], arch
        log = pd.read_csv(run / "train_log.csv")
        assert len(log) == 1 and np.isfinite(log["train_loss"]).all(), arch


def test_counts_equal_the_stored_masks_recounted(cohort):
    """Per architecture: one counts row per test image x foreground class (1, 2); tp/fp/fn/tn = the stored
    ``pred`` against the dataset's mask PNG (pixel value = class id), recounted with NumPy."""
    study, data, _ = cohort
    index = pd.read_csv(data / "index.csv").set_index("sample_id")
    for arch, run in _runs(study).items():
        split = pd.read_csv(run / "split.csv")
        test_ids = sorted(split.loc[split["split"] == "test", "sample_id"])
        assert len(test_ids) == 2
        counts = pd.read_parquet(run / "evaluation" / "best" / "counts.parquet")
        assert sorted(zip(counts["image_id"], counts["class_id"])) == [(i, c) for i in test_ids for c in (1, 2)]
        got = counts.set_index(["image_id", "class_id"])
        for image_id in test_ids:
            with np.load(run / "evaluation" / "best" / "predictions" / f"{image_id}.npz") as z:
                pred, class_ids = z["pred"].astype(bool), [int(c) for c in z["class_ids"]]
            mask = np.array(Image.open(io.BytesIO((data / index.loc[image_id, "mask_path"]).read_bytes())))
            assert class_ids == [1, 2] and pred.shape == (2, *mask.shape), arch
            for k, c in enumerate(class_ids):
                p, r = pred[k], mask == c
                row = got.loc[(image_id, c)]
                assert (int(row["tp"]), int(row["fp"]), int(row["fn"]), int(row["tn"])) == (
                    int((p & r).sum()), int((p & ~r).sum()), int((~p & r).sum()), int((~p & ~r).sum())), \
                    (arch, image_id, c)


def test_leaderboard_lists_the_eleven(cohort):
    """The closing leaderboard (CSV on stdout) names all eleven: a row per system, ranked by image-macro Dice (the
    mean over classes of the mean over images of 2tp / (2tp + fp + fn), 0/0 rows skipped, recomputed here from the
    counts), or, for a system whose counts equal a listed one's on every image x class (after one epoch several
    networks may predict the same empty masks), the line "A is identical to B ... shown once, as B" (or "A, C are
    identical to B ..."), checked against the counts files."""
    study, _, stdout = cohort
    lines = stdout.splitlines()
    start = lines.index("rank,system,image-macro Dice,global-micro Dice,images")
    end = next(i for i in range(start + 1, len(lines)) if not re.match(r"^\d+,[^,]+,[0-9.]+,[0-9.]+,\d+$", lines[i]))
    board = pd.read_csv(io.StringIO("\n".join(lines[start:end])))
    listed = {s.rsplit("-", 1)[0]: s for s in board["system"]}
    same = {dup: kept for dups, kept in re.findall(r"^(\S+(?:, \S+)*) (?:is|are) identical to (\S+) \(identical "
                                                   r"counts", stdout, flags=re.M) for dup in dups.split(", ")}
    runs = _runs(study)
    key = ["image_id", "class_id", "tp", "fp", "fn", "tn"]

    def counts(arch: str) -> pd.DataFrame:
        c = pd.read_parquet(runs[arch] / "evaluation" / "best" / "counts.parquet")
        return c[key].astype({k: "int64" for k in key[1:]}).sort_values(key[:2]).reset_index(drop=True)

    for dup, kept in same.items():
        assert kept in set(board["system"]), (dup, kept)
        pd.testing.assert_frame_equal(counts(dup.rsplit("-", 1)[0]), counts(kept.rsplit("-", 1)[0]))
    assert sorted([*listed, *(d.rsplit("-", 1)[0] for d in same)]) == sorted(SIZES)
    assert len(board) + len(same) == 11
    for arch, system in listed.items():
        c = counts(arch)
        den = 2 * c["tp"] + c["fp"] + c["fn"]
        dice = (2 * c["tp"] / den.where(den > 0)).groupby(c["class_id"]).mean().mean()
        row = board[board["system"] == system].iloc[0]
        assert float(row["image-macro Dice"]) == pytest.approx(dice, abs=5e-4), arch
        assert int(row["images"]) == 2
    assert list(board["rank"]) == sorted(board["rank"])
    assert list(board["image-macro Dice"]) == sorted(board["image-macro Dice"], reverse=True)
