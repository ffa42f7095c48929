"""Every architecture of the zoo trains one epoch on a few real Kvasir-SEG images and produces counts
(slow; CI runs it). Architecture configs come from ``configs/architectures/`` (the papers' recipes); the study
overrides shrink them: 64×64 inputs (G-CASCADE: 128×128, its minimum for k = 11, in a second study whose
``model.params.img_size`` matches, without multi-scale: 0.75 × 128 = 96 px gives a 3×3 graph < k), 4 images
per split, batch 4, 1 epoch. This checks the chain, not scores."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pandas as pd
import pytest
import yaml

from msb.data.converters import prepare_dataset
from msb.study.pipeline import run_study

REPO = Path(__file__).resolve().parents[2]
MAIN = ["unet_r18", "pranet", "polyp_pvt", "sanet", "pvt_cascade", "segformer_b0"]


def _recount(eval_dir: Path, data_root: Path) -> pd.DataFrame:
    """tp, fp, fn, tn, height, width per image x class, recounted with NumPy from the stored predictions
    (``predictions/<image_id>.npz`` key ``pred``) against the prepared dataset's mask files (raw values mapped
    to classes by ``classes.csv``), independently of the evaluator: TP = sum(pred & ref), etc."""
    index = pd.read_csv(data_root / "index.csv", dtype=str).set_index("sample_id")
    classes = pd.read_csv(data_root / "classes.csv", dtype={"source_values": str})
    values = {int(r.class_id): [int(v) for v in r.source_values.split(";")] for r in classes.itertuples()}
    rows = []
    for npz in sorted((eval_dir / "predictions").glob("*.npz")):
        with np.load(npz) as z:
            pred, class_ids = z["pred"].astype(bool), z["class_ids"].reshape(-1)
        mask = cv2.imread(str(data_root / index.loc[npz.stem, "mask_path"]), cv2.IMREAD_UNCHANGED)
        for k, c in enumerate(class_ids):
            ref = np.isin(mask, values[int(c)])
            p = pred[k]
            rows.append({"image_id": npz.stem, "class_id": int(c), "tp": int((p & ref).sum()),
                         "fp": int((p & ~ref).sum()), "fn": int((~p & ref).sum()), "tn": int((~p & ~ref).sum()),
                         "height": mask.shape[0], "width": mask.shape[1]})
    return pd.DataFrame(rows)


def _study(path: Path, name: str, archs: list[str], data_root: Path, cache: Path, size: int, model=None,
           **train) -> Path:
    overrides = {"data": {"root": str(data_root), "prepare": None, "cache_dir": str(cache), "input_size": [size, size],
                          "max_samples_per_split": 4},
                 "train": {"epochs": 1, "batch_size": 4, "device": "cpu", **train}}
    if model:
        overrides["model"] = model
    spec = {"study": name, "configs_root": str(REPO / "configs"), "datasets": ["kvasir_seg"],
            "architectures": archs, "overrides": overrides}
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.slow
def test_every_architecture_trains_one_epoch_on_kvasir(tmp_path: Path, shared_dir: Path):
    data = tmp_path / "kvasir"
    prepare_dataset("kvasir-seg", shared_dir / "data" / "kvasir-seg", data, limit=24)
    studies = [_study(tmp_path / "main.yaml", "zoo", MAIN, data, tmp_path / "cache", 64),
               _study(tmp_path / "gc.yaml", "zoo_gc", ["g_cascade"], data, tmp_path / "cache", 128,
                      model={"params": {"img_size": 128}}, multiscale=None)]  # 0.75 x 128 -> 3x3 < k nodes
    outcomes = [o for s in studies for o in run_study(s, run_root=str(tmp_path / "runs"))]
    assert len(outcomes) == len(MAIN) + 1
    archs = set()
    for o in outcomes:
        assert o.train is not None and o.train.epochs_done == 1
        counts = pd.read_parquet(o.counts_paths[0])
        # the counts are the stored predictions recounted against the Kvasir mask files (native resolution)
        cols = ["image_id", "class_id", "tp", "fp", "fn", "tn", "height", "width"]
        expected = _recount(o.counts_paths[0].parent, data)
        split = pd.read_csv(o.run_dir / "split.csv")
        n_test = min(4, int((split["split"] == "test").sum()))  # max_samples_per_split: 4; one class
        assert n_test >= 1 and len(counts) == len(expected) == n_test
        pd.testing.assert_frame_equal(
            counts[cols].astype({c: "int64" for c in cols[1:]}).sort_values(cols[:2]).reset_index(drop=True),
            expected[cols].astype({c: "int64" for c in cols[1:]}).sort_values(cols[:2]).reset_index(drop=True))
        sem = json.loads((o.counts_paths[0].parent / "prediction_semantics.json").read_text())
        archs.add(sem["model"])
        expected_rule = "sum" if sem["model"] in ("polyp_pvt", "pvt_cascade", "g_cascade") else "first"
        assert sem["test_time_rule"] == expected_rule
        assert sem["test_time_adjustment"] == ("pcs" if sem["model"] == "sanet" else "none")
        assert sem["test_time_normalisation"] == "none"
    assert archs == {"unet", "pranet", "polyp_pvt", "sanet", "pvt_cascade", "segformer", "g_cascade"}
