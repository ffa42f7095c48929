"""Acceptance on real data (../shared/data/kvasir-seg), CPU, tiny input: a grid study (2 learning rates x
3 folds) and a Hyperband study (3 trials x 3 folds), each killed with SIGKILL after the first fold's first epoch
and resumed; both must finish with counts for every fold and for the fold ensemble, on the held-out test split
and on an external set.

External set: a disjoint slice of Kvasir-SEG (frames 31-45 by file name; training uses frames 1-30) prepared as
another dataset with the generic ``folder`` converter (masks binarised at > 127, class named ``lesion``), mapped
onto the model's ``polyp`` class with ``class_map: {polyp: [lesion]}``. Same modality, so the scores mean
something; none of the near-identical pairs listed in PROVENANCE.md falls inside the first 45 names, so no
pair straddles the two slices. (BUSI has no converter yet and is another modality.)
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import cv2
import pandas as pd
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]

KNOWN_PAIRS = ["cju30bmab08bi0835mvlr6e0r", "cju77k828z46w0871r0avuoo9", "cju76lsehyia10987u54vn8rb",
               "cju772304yw5t0818vbw8kkjf", "cju886ryxnsl50801r93jai7q", "cju8amfdtqi4x09871tygrgqe",
               "cju5fydrud94708507vo6oy21", "cju7avvi51iox0817ym55y6tt", "cju1hhj6mxfp90835n3wofrap",
               "cju3x9lttikfb0818a0g104zn", "cju1gi7jlwyld0835cdf6g6qz", "cju5uget8krjy0818kvywd0zu"]


def _project(root: Path, kvasir: Path) -> dict[str, Path]:
    names = sorted(p.name for p in (kvasir / "images").iterdir())
    assert not set(n.rsplit(".", 1)[0] for n in names[:45]) & set(KNOWN_PAIRS)
    ext_src = root / "ext_src"
    for sub in ("images", "masks"):
        (ext_src / sub).mkdir(parents=True)
        for n in names[30:45]:
            os.symlink(kvasir / sub / n, ext_src / sub / n)
    cfg = root / "configs"
    (cfg / "datasets").mkdir(parents=True)
    (cfg / "architectures").mkdir()
    (cfg / "global.yaml").write_text((REPO / "configs" / "global.yaml").read_text())
    (cfg / "datasets" / "kvasir_tiny.yaml").write_text(yaml.safe_dump({"data": {
        "name": "kvasir_tiny", "root": str(root / "datasets" / "kvasir_tiny"),
        "prepare": {"converter": "kvasir-seg", "source": str(kvasir), "options": {"limit": 30}},
        "split": {"mode": "random", "val_fraction": 0.2, "test_fraction": 0.2, "seed": 0, "group_column": "group"},
        "input_size": [32, 32]}}))
    (cfg / "datasets" / "kvasir_slice.yaml").write_text(yaml.safe_dump({"data": {
        "name": "kvasir_slice", "root": str(root / "datasets" / "kvasir_slice"),
        "prepare": {"converter": "folder", "source": str(ext_src),
                    "options": {"threshold": 127, "foreground_name": "lesion", "source_label": "kvasir-seg-31-45"}}}}))
    (cfg / "architectures" / "unet_tiny.yaml").write_text(yaml.safe_dump({"model": {
        "arch": "unet", "encoder": "tu-mobilenetv3_small_050", "encoder_weights": None,
        "params": {"decoder_channels": [16, 8, 8, 8, 8]}}}))
    common = {"run_root": str(root / "runs"), "datasets": ["kvasir_tiny"], "architectures": ["unet_tiny"],
              "cross_validation": {"k": 3, "group_column": "group"},
              "final": {"checkpoint": "best", "test_split": "test",
                        "external": [{"dataset": "kvasir_slice", "class_map": {"polyp": ["lesion"]}}]}}
    ov = {"full_determinism": True, "evaluation": {"compute_metrics": False}}
    grid = {"study": "kv_grid", **common,
            "overrides": {**ov, "train": {"epochs": 1, "batch_size": 8, "device": "cpu"}},
            "search": {"method": "grid", "params": {"train.optimizer.lr": [0.001, 0.003]}}}
    hb = {"study": "kv_hyperband", **common,
          "overrides": {**ov, "train": {"epochs": 2, "batch_size": 8, "device": "cpu"}},
          "search": {"method": "hyperband", "n_trials": 3, "min_epochs": 1, "reduction_factor": 2,
                     "sampler": {"name": "tpe", "seed": 0},
                     "params": {"train.optimizer.lr": {"type": "float", "low": 0.0005, "high": 0.01, "log": True}}}}
    out = {}
    for name, data in (("grid", grid), ("hyperband", hb)):
        path = cfg / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        out[name] = path
    out["ext_masks"] = [kvasir / "masks" / n for n in names[30:45]]
    return out


def _run_killed_and_resumed(study: Path, study_dir: Path, log: Path, msb_popen, msb_cli) -> str:
    p = msb_popen("run", str(study), log=log)
    t0 = time.monotonic()
    while not list(study_dir.glob("*-fold0/state/train_state.pt")):
        assert p.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() - t0 < 200
        time.sleep(0.05)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    r = msb_cli("run", str(study))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


@pytest.mark.slow
@pytest.mark.shared_data
def test_grid_and_hyperband_studies_on_kvasir(shared_dir: Path, tmp_path: Path, msb_popen, msb_cli):
    kvasir = shared_dir / "data" / "kvasir-seg"
    if not (kvasir / "images").is_dir():
        pytest.skip(f"{kvasir} not found")
    proj = _project(tmp_path, kvasir)
    ext_ref = {p.stem: int((cv2.imread(str(p), cv2.IMREAD_GRAYSCALE) > 127).sum()) for p in proj["ext_masks"]}
    for name, study_name in (("grid", "kv_grid"), ("hyperband", "kv_hyperband")):
        sdir = tmp_path / "runs" / study_name
        out = _run_killed_and_resumed(proj[name], sdir, tmp_path / f"{name}.log", msb_popen, msb_cli)
        assert "re-attaching trial" in out
        unit = sdir / "_study" / "kvasir_tiny-unet_tiny"
        folds = pd.read_csv(unit / "folds.csv", keep_default_na=False)
        assert sorted(folds["fold"].value_counts().sort_index().index) == [-1, 0, 1, 2]
        test_ids = set(folds.loc[folds["fold"] == -1, "sample_id"])
        counts = {p: pd.read_parquet(p) for p in sdir.rglob("counts.parquet")}
        fold_ext = [df for p, df in counts.items() if "external" in p.parts and "-fold" in str(p)]
        fold_test = [df for p, df in counts.items() if "external" not in p.parts and "-fold" in str(p)]
        ens = [df for p, df in counts.items() if "-ensemble" in str(p)]
        assert sorted(int(df["fold"].iloc[0]) for df in fold_ext) == [0, 1, 2]
        assert sorted(int(df["fold"].iloc[0]) for df in fold_test) == [0, 1, 2]
        assert len(ens) == 2 and all(set(df["fold"]) == {-1} for df in ens)
        assert {df["dataset"].iloc[0] for df in ens} == {"kvasir_tiny", "kvasir_slice"}
        for df in fold_test:
            assert set(df["image_id"]) == test_ids and (df["width"] >= 332).all()  # native resolution
        for df in fold_ext + [d for d in ens if d["dataset"].iloc[0] == "kvasir_slice"]:
            assert df.set_index("image_id")["reference"].to_dict() == ext_ref
            assert set(df["class_name"]) == {"polyp"}
        sel = yaml.safe_load((unit / "selected.json").read_text())
        assert len(sel["trials"]) == (2 if name == "grid" else 3)
        assert all(t["state"] in ("COMPLETE", "PRUNED") for t in sel["trials"])
        assert (unit / "manifest.json").is_file() and (sdir / "scores.csv").is_file()
