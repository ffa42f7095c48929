"""External test sets: class mapping rules, evaluation of a trained run on another prepared dataset with merged
classes (counts checked against the masks), and the CLI (`msb evaluate RUN --external DIR --class-map`)."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pandas as pd
import pytest

from msb.config.generate import generate_runs
from msb.data.schema import ClassSpec, write_prepared_dataset
from msb.data.prepare import ensure_dataset
from msb.engine.runner import train_run
from msb.errors import MSBError
from msb.evaluation.evaluator import map_reference_classes
from msb.study.external import evaluate_external, parse_class_map_option, resolve_class_map, resolve_external
from msb.config.study_spec import ExternalSpec

MODEL = [ClassSpec(0, "background", (0,)), ClassSpec(1, "polyp", (255,))]
EXT = [ClassSpec(0, "background", (0,)), ClassSpec(1, "benign", (100,)), ClassSpec(2, "malignant", (200,))]


def test_resolve_class_map():
    assert resolve_class_map({1: [1, 2]}, MODEL, EXT) == {1: (1, 2)}
    assert resolve_class_map({"polyp": ["malignant", "benign"]}, MODEL, EXT) == {1: (1, 2)}
    assert resolve_class_map({"1": ["2"]}, MODEL, EXT) == {1: (2,)}  # CLI strings
    assert resolve_class_map(None, MODEL, [ClassSpec(0, "bg", (0,)), ClassSpec(1, "lesion", (1,))]) == {1: (1,)}
    for cmap, needle in [(None, "declare a class_map"), ({1: [3]}, "external class id 3 does not exist"),
                         ({"tumour": [1]}, "model class 'tumour' does not exist"), ({1: [0]}, "background class"),
                         ({1: []}, "maps to no external class"), ({}, "are not mapped")]:
        with pytest.raises(MSBError, match=needle):
            resolve_class_map(cmap, MODEL, EXT, "study.yaml")
    two = MODEL + [ClassSpec(2, "adenoma", (128,))]
    with pytest.raises(MSBError, match="mapped to two model classes"):
        resolve_class_map({1: [1], 2: [1, 2]}, two, EXT)


def test_map_reference_classes_hand():
    """Channel 0 = ext class 1, channel 1 = ext class 2; target class 1 = union of both, target 2 = ext 2."""
    ref = np.array([[[1, 0, 0]], [[0, 1, 0]]], bool)  # (2, 1, 3)
    out = map_reference_classes(ref, [1, 2], {1: (1, 2), 2: (2,)}, [1, 2])
    assert out.tolist() == [[[True, True, False]], [[False, True, False]]]


def test_parse_class_map_option():
    assert parse_class_map_option(["1=1,2", "polyp = lesion"]) == {"1": ["1", "2"], "polyp": ["lesion"]}
    assert parse_class_map_option([]) is None
    with pytest.raises(MSBError, match="MODEL_CLASS=EXT_CLASS"):
        parse_class_map_option(["1:2"])


def _three_class_dataset(root: Path) -> dict[str, np.ndarray]:
    """4 images 20x24 (H x W) with raw mask values 0 / 100 (benign) / 200 (malignant)."""
    rng = np.random.default_rng(3)
    masks, rows = {}, []
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    for i in range(4):
        sid = f"ext_{i}"
        img = rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)
        m = np.zeros((20, 24), np.uint8)
        m[2:8, 3:10] = 100
        m[10 + i: 15 + i, 12:20] = 200
        if i == 3:
            m[:] = 0  # an empty reference
        cv2.imwrite(str(root / "images" / f"{sid}.png"), img)
        cv2.imwrite(str(root / "masks" / f"{sid}.png"), m)
        masks[sid] = m
        rows.append({"sample_id": sid, "image_path": f"images/{sid}.png", "mask_path": f"masks/{sid}.png",
                     "split": "test" if i < 3 else "train", "group": "", "height": 20, "width": 24, "source": "hand"})
    write_prepared_dataset(root, pd.DataFrame(rows), EXT)
    return masks


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, make_project):
    root = tmp_path_factory.mktemp("ext")
    study = make_project(root, {"study": "ext"})
    run = generate_runs(study)[0]
    ds = ensure_dataset(run.config)
    run_dir = root / "runs" / "ext" / run.run_id
    train_run(run, run_dir, ds)
    masks = _three_class_dataset(root / "three")
    return root, run_dir, ds, masks


def test_evaluate_external_with_merged_classes(trained_run):
    root, run_dir, ds, masks = trained_run
    ext = resolve_external(ExternalSpec(dataset=str(root / "three"), name="three", class_map={"polyp": ["benign", "malignant"]}),
                           ds.classes, None, None, "test")
    paths = evaluate_external(run_dir, ["best"], ext, ds)
    df = pd.read_parquet(paths[0])
    assert paths[0] == run_dir / "evaluation" / "external" / "three" / "best" / "counts.parquet"
    assert sorted(df["image_id"]) == sorted(masks)
    expected_ref = {sid: int(np.isin(m, [100, 200]).sum()) for sid, m in masks.items()}
    assert df.set_index("image_id")["reference"].to_dict() == expected_ref
    assert (df["height"] == 20).all() and (df["width"] == 24).all()
    assert set(df["dataset"]) == {"three"} and set(df["split"]) == {"all"} and set(df["fold"]) == {-1}
    assert set(df["class_name"]) == {"polyp"} and set(df["class_id"]) == {1}
    with np.load(run_dir / "evaluation" / "external" / "three" / "best" / "predictions" / "ext_0.npz") as z:
        assert (z["ref"][0] == np.isin(masks["ext_0"], [100, 200])).all()
        assert int(z["pred"].sum()) == int(df.set_index("image_id").loc["ext_0", "predicted"])
    # only the benign class, only the test split of the external index
    ext2 = resolve_external(ExternalSpec(dataset=str(root / "three"), name="benign_only", split="test",
                                         class_map={1: [1]}), ds.classes, None, None, "test")
    df2 = pd.read_parquet(evaluate_external(run_dir, ["best"], ext2, ds)[0])
    assert df2.set_index("image_id")["reference"].to_dict() == {f"ext_{i}": 42 for i in range(3)}  # 6 x 7 pixels
    # a different mapping is a different evaluation: the fingerprint differs, nothing is skipped wrongly
    assert ext.fingerprint != ext2.fingerprint


def test_cli_evaluate_external(trained_run, msb_cli):
    root, run_dir, ds, masks = trained_run
    r = msb_cli("evaluate", str(run_dir), "--external", str(root / "three"), "--class-map", "1=1,2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "already done" in r.stderr  # (status lines: stderr when stdout is data) same checkpoint, dataset, samples and mapping as the test above
    df = pd.read_parquet(run_dir / "evaluation" / "external" / "three" / "best" / "counts.parquet")
    assert set(df["dataset"]) == {"three"}
    r = msb_cli("evaluate", str(run_dir), "--external", str(root / "three"))
    assert r.returncode == 2 and "declare a class_map" in r.stderr and "Traceback" not in r.stderr
    r = msb_cli("evaluate", str(run_dir), "--external", str(root / "nowhere"), "--class-map", "1=1")
    assert r.returncode == 2 and "not found" in r.stderr and "nowhere" in r.stderr
    r = msb_cli("evaluate", str(run_dir), "--class-map", "1=1")
    assert r.returncode == 2 and "--external" in r.stderr
