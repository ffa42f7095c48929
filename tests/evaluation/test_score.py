"""``msb score``: external prediction folders scored into run folders (counts, predictions, metrics).

References: hand-made masks whose counts are written out here, the metric oracle (``../shared/oracle``:
TP/FP/FN/TN, Dice, IoU, HD95, ASSD, NSD from an independent numpy/scipy reference), ``msb evaluate``'s own
counts of a trained run, and ``py_sod_metrics`` for the LEGACY six-metric table.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from _oracle import case_names, close, load_case, shared_dir
from _score_data import write_dataset, write_png
from msb.config.metrics_schema import MetricsConfig
from msb.data.schema import load_prepared_dataset
from msb.errors import MSBError
from msb.evaluation.score import find_targets, score_target
from msb.evaluation.score_io import Semantics

REPO = Path(__file__).resolve().parents[2]


def msb(*args: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", COLUMNS="250", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "msb", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _masks():
    a = np.zeros((6, 8), bool)
    a[1:4, 2:6] = True  # 12 px
    b = np.zeros((5, 5), bool)
    b[0, 0] = True
    return {"a": a, "b": b}


def _score(tmp_path: Path, pred_dir: Path, sem: Semantics, **kw):
    ds_root = tmp_path / "ds"
    (t,) = find_targets(pred_dir, [str(ds_root)], "flat", "m")
    return score_target(t, sem, tmp_path / "out", metrics=MetricsConfig(), **kw)


def test_binary_pngs_give_hand_counts_and_run_folder_files(tmp_path: Path):
    """a: prediction = reference shifted one column right -> TP 9, FP 3, FN 3, TN 33 (48 px);
    b: empty prediction of a 1-pixel reference -> TP 0, FP 0, FN 1, TN 24. 0/255 PNGs and a 0/1 PNG."""
    m = _masks()
    write_dataset(tmp_path / "ds", m)
    pa = np.roll(m["a"], 1, axis=1)
    write_png(tmp_path / "p" / "a.png", pa.astype(np.uint8) * 255)
    write_png(tmp_path / "p" / "b.png", np.zeros((5, 5), np.uint8))
    res = _score(tmp_path, tmp_path / "p", Semantics("binary"))
    c = pd.read_parquet(res.eval_dir / "counts.parquet").set_index("image_id")
    assert c.loc["a", ["tp", "fp", "fn", "tn"]].tolist() == [9, 3, 3, 33]
    assert c.loc["b", ["tp", "fp", "fn", "tn"]].tolist() == [0, 0, 1, 24]
    assert set(c["checkpoint_role"]) == {"scored"} and set(c["threshold_on"]) == {"probability"}
    for f in ("config.yaml", "config.sha256", "split.csv", "manifest.json", "evaluation/scored/metrics.parquet",
              "evaluation/scored/predictions/a.npz", "evaluation/scored/digests.json", "evaluation/scored/DONE",
              "evaluation/scored/prediction_semantics.json"):
        assert (res.run_dir / f).is_file(), f
    z = np.load(res.eval_dir / "predictions" / "a.npz")
    assert (z["pred"][0] == pa).all() and (z["ref"][0] == m["a"]).all() and (z["prob"][0] == pa * 255).all()
    sem = json.loads((res.eval_dir / "prediction_semantics.json").read_text())
    assert sem["kind"] == "binary" and sem["threshold"] == 0.5 and sem["minmax"] is False
    from msb.utils.evaluation_folder import check_counts_digest, check_predictions, regenerate_command

    assert check_counts_digest(res.eval_dir / "counts.parquet") and check_predictions(res.eval_dir, ["a", "b"])
    assert regenerate_command(res.eval_dir).startswith("msb score")


def test_probability_maps_threshold_minmax_and_16bit(tmp_path: Path):
    """16-bit PNG, p = v / 65535: [[0, 30000, 40000, 65535]] at threshold 0.5 -> 40000 and 65535 foreground;
    with --minmax the map spans 0..1 already, so the same; an 8-bit map kept bit for bit as prob."""
    ref = np.array([[0, 1, 1, 1]], bool)
    write_dataset(tmp_path / "ds", {"x": ref})
    write_png(tmp_path / "p" / "x.png", np.array([[0, 30000, 40000, 65535]], np.uint16))
    res = _score(tmp_path, tmp_path / "p", Semantics("probability"))
    c = pd.read_parquet(res.eval_dir / "counts.parquet").iloc[0]
    assert (c.tp, c.fp, c.fn, c.tn) == (2, 0, 1, 1)
    assert np.load(res.eval_dir / "predictions" / "x.npz")["prob"][0, 0].tolist() == [0, 117, 156, 255]  # round(255 p)
    u8 = np.array([[10, 100, 120, 200]], np.uint8)  # min-max: (u - 10) / 190 -> 0, .47, .58, 1
    write_png(tmp_path / "q" / "x.png", u8)
    res = _score(tmp_path, tmp_path / "q", Semantics("probability", minmax=True), force=True)
    c = pd.read_parquet(res.eval_dir / "counts.parquet").iloc[0]
    assert (c.tp, c.fp, c.fn, c.tn, c.threshold_on) == (2, 0, 1, 1, "minmax_probability")
    assert np.load(res.eval_dir / "predictions" / "x.npz")["prob"][0, 0].tolist() == u8[0].tolist()


def test_bad_predictions_are_refused_naming_the_file(tmp_path: Path):
    m = _masks()
    write_dataset(tmp_path / "ds", m)
    p = tmp_path / "p"
    write_png(p / "a.png", m["a"].astype(np.uint8) * 255)
    with pytest.raises(MSBError, match=r"no prediction file for 1 of 2 sample\(s\) \(b\)"):
        _score(tmp_path, p, Semantics("binary"))
    write_png(p / "b.png", np.full((5, 5), 7, np.uint8))
    with pytest.raises(MSBError, match=r"b\.png: not a binary mask: values 7"):
        _score(tmp_path, p, Semantics("binary"))
    write_png(p / "b.png", np.zeros((4, 5), np.uint8))
    with pytest.raises(MSBError, match=r"b\.png: prediction is 4x5 px but the image is 5x5 px"):
        _score(tmp_path, p, Semantics("binary"))
    write_png(p / "b.png", np.zeros((5, 5), np.uint8))
    write_png(p / "zz.png", np.zeros((5, 5), np.uint8))
    with pytest.raises(MSBError, match=r"zz\.png: 1 prediction file\(s\) match no sample"):
        _score(tmp_path, p, Semantics("binary"))
    (p / "zz.png").unlink()
    np.save(p / "c.npy", np.full((5, 5), 1.5))
    with pytest.raises(MSBError, match=r"c\.npy: 1 prediction file"):  # extra, named before being read
        _score(tmp_path, p, Semantics("probability"))
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())  # nothing half-written


def test_allow_missing_scores_empty_predictions_and_reports_them(tmp_path: Path):
    m = _masks()
    write_dataset(tmp_path / "ds", m)
    write_png(tmp_path / "p" / "a.png", m["a"].astype(np.uint8) * 255)
    res = _score(tmp_path, tmp_path / "p", Semantics("binary"), allow_missing=True)
    assert res.missing == ["b"]
    c = pd.read_parquet(res.eval_dir / "counts.parquet").set_index("image_id")
    assert c.loc["b", ["tp", "fp", "fn", "tn"]].tolist() == [0, 0, 1, 24]  # empty prediction: the pixel is missed
    assert c.loc["a", ["tp", "fp", "fn", "tn"]].tolist() == [12, 0, 0, 36]
    assert json.loads((res.eval_dir / "score.json").read_text())["missing"] == ["b"]


def test_resize_nearest_to_native_size(tmp_path: Path):
    """A 3x4 mask upsampled x2 (nearest) onto the 6x8 reference it was made from: perfect counts."""
    ref = np.zeros((6, 8), bool)
    ref[2:4, 2:6] = True
    write_dataset(tmp_path / "ds", {"a": ref})
    write_png(tmp_path / "p" / "a.png", ref[::2, ::2].astype(np.uint8) * 255)
    res = _score(tmp_path, tmp_path / "p", Semantics("binary", resize="nearest"))
    c = pd.read_parquet(res.eval_dir / "counts.parquet").iloc[0]
    assert (c.tp, c.fp, c.fn, c.tn) == (8, 0, 0, 40)


@pytest.mark.shared_data
def test_oracle_cases_give_the_oracle_counts_and_metrics(tmp_path: Path):
    """Every oracle case with both masks non-empty, as a dataset (reference PNG + spacing) and a binary PNG
    folder: TP/FP/FN/TN, Dice and IoU equal the oracle's ``oracle_numpy``; HD95 (max of the directed 95th
    percentiles, the default convention) and pooled ASSD to 1e-6; NSD at 1, 2, 5 px for unit spacing."""
    names = case_names(nonempty=True)
    cases = {n: load_case(n) for n in names}
    write_dataset(tmp_path / "ds", {n: c[1] for n, c in cases.items()})
    idx = pd.read_csv(tmp_path / "ds" / "index.csv")
    idx["spacing_row"] = [cases[s][2][0] for s in idx["sample_id"]]
    idx["spacing_col"] = [cases[s][2][1] for s in idx["sample_id"]]
    idx.to_csv(tmp_path / "ds" / "index.csv", index=False)
    for n, (pred, _, _, _) in cases.items():
        write_png(tmp_path / "p" / f"{n}.png", pred.astype(np.uint8) * 255)
    res = _score(tmp_path, tmp_path / "p", Semantics("binary"))
    counts = pd.read_parquet(res.eval_dir / "counts.parquet").set_index("image_id")
    mt = pd.read_parquet(res.eval_dir / "metrics.parquet").set_index("image_id")
    bad = []
    for n, (_, _, spacing, ref) in cases.items():
        o, c, m = ref["oracle_numpy"], counts.loc[n], mt.loc[n]
        got = {"tp": c.tp, "fp": c.fp, "fn": c.fn, "tn": c.tn, "dice": 2 * c.tp / (2 * c.tp + c.fp + c.fn),
               "iou": c.tp / (c.tp + c.fp + c.fn), "hd95_max_directed": m["hd95"], "assd_pooled": m["assd"]}
        if spacing == (1.0, 1.0):
            got.update({f"nsd_tau{t}": m[f"nsd_tau{t}px"] for t in (1, 2, 5)})
        bad += [f"{n}.{k}: {v} != {o[k]}" for k, v in got.items() if not close(v, o[k], atol=1e-6)]
    assert not bad, bad


@pytest.mark.shared_data
def test_oracle_probability_case_as_float_npy(tmp_path: Path):
    """``low_confidence_prob_224``: its ``pred_prob`` as a float NPY probability map at 0.5 gives the oracle's
    counts (pred = pred_prob >= 0.5 is empty there: TP 0, FP 0)."""
    _, gt, _, ref = load_case("low_confidence_prob_224")
    prob = np.load(shared_dir("oracle") / "cases" / "low_confidence_prob_224.npz")["pred_prob"]
    write_dataset(tmp_path / "ds", {"c": gt})
    (tmp_path / "p").mkdir()
    np.save(tmp_path / "p" / "c.npy", prob.astype(np.float64))
    res = _score(tmp_path, tmp_path / "p", Semantics("probability"))
    c = pd.read_parquet(res.eval_dir / "counts.parquet").iloc[0]
    o = ref["oracle_numpy"]
    assert [c.tp, c.fp, c.fn, c.tn] == [o["tp"], o["fp"], o["fn"], o["tn"]]


def _sod_dataset_scores(preds_u8: list[np.ndarray], gts: list[np.ndarray]) -> dict[str, float]:
    """py_sod_metrics over one dataset, as the PraNet-style Python evaluators run it: one object stepped
    over every image."""
    import py_sod_metrics as sod

    fm = sod.FmeasureV2(metric_handlers={"dice": sod.DICEHandler(with_dynamic=True, with_adaptive=False),
                                         "iou": sod.IOUHandler(with_dynamic=True, with_adaptive=False)})
    sm, wfm, em, mae = sod.Smeasure(), sod.WeightedFmeasure(), sod.Emeasure(), sod.MAE()
    for p, g in zip(preds_u8, gts):
        g8 = g.astype(np.uint8) * 255
        for obj in (fm, sm, wfm, em, mae):
            obj.step(pred=p, gt=g8)
    r, e = fm.get_results(), em.get_results()["em"]["curve"]
    return {"mDice": float(np.mean(r["dice"]["dynamic"])), "mIoU": float(np.mean(r["iou"]["dynamic"])),
            "wF": float(wfm.get_results()["wfm"]), "S_alpha": float(sm.get_results()["sm"]),
            "E_phi_mean": float(np.mean(e)), "E_phi_max": float(np.max(e)), "MAE": float(mae.get_results()["mae"])}


def test_cli_pranet_layout_two_models_two_datasets_six_metric_table(tmp_path: Path, monkeypatch, capsys):
    """``msb score RESULTS --layout pranet`` over <model>/<dataset>/<id>.png for models A, B and datasets
    Kvasir, ClinicDB: four run folders, and the LEGACY six-metric table whose cell (B, ClinicDB) equals
    py_sod_metrics computed here on the same PNGs, to 1e-12 (CSV, full precision)."""
    rng = np.random.default_rng(3)
    gts = {}
    for name, n, size in (("Kvasir", 3, (18, 22)), ("ClinicDB", 2, (16, 16))):
        masks = {f"{name.lower()}{i}": rng.random(size) > 0.55 for i in range(n)}
        masks[f"{name.lower()}0"][:] = False  # an empty reference
        gts[name] = masks
        write_dataset(tmp_path / name, masks)
    maps = {}
    for model in ("A", "B"):
        for name, masks in gts.items():
            for sid, g in masks.items():
                u = (rng.random(g.shape) * 200 + 20 * g).astype(np.uint8)  # not min-max normalised: 0..219
                if sid.endswith("1"):
                    u[:] = 77  # a constant map
                maps[(model, name, sid)] = u
                write_png(tmp_path / "results" / model / name / f"{sid}.png", u)
    r = msb("score", "results", "--layout", "pranet", "--dataset", f"Kvasir={tmp_path / 'Kvasir'}",
            "--dataset", f"ClinicDB={tmp_path / 'ClinicDB'}", "--semantics", "probability", "--legacy",
            "--out", "scored", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(p.name for p in (tmp_path / "scored").iterdir() if (p / "config.yaml").is_file()) == \
        ["A-ClinicDB", "A-Kvasir", "B-ClinicDB", "B-Kvasir"]
    table = pd.read_csv(tmp_path / "scored" / "legacy_six_metric.csv", index_col=0)
    assert "LEGACY" in table.index.name and list(table.index) == ["A", "B"]
    ids = sorted(gts["ClinicDB"])
    expected = _sod_dataset_scores([maps[("B", "ClinicDB", s)] for s in ids], [gts["ClinicDB"][s] for s in ids])
    for metric, v in expected.items():
        assert abs(table.loc["B", f"ClinicDB/{metric}"] - v) <= 1e-12, (metric, table.loc["B", f"ClinicDB/{metric}"], v)
    assert "LEGACY" in (tmp_path / "scored" / "legacy_six_metric.tex").read_text()
    assert "LEGACY" in (tmp_path / "scored" / "legacy_six_metric.md").read_text()
    # msb metrics RUN --legacy on one scored run (stored predictions): its own table, same cell
    from msb.cli import main

    monkeypatch.setattr(sys, "argv", ["msb", "metrics", str(tmp_path / "scored" / "B-ClinicDB"), "--legacy"])
    main()
    run_table = pd.read_csv(tmp_path / "scored" / "B-ClinicDB" / "legacy_table" / "legacy_six_metric.csv", index_col=0)
    assert abs(run_table.loc["B", "ClinicDB/mIoU"] - expected["mIoU"]) <= 1e-12
    capsys.readouterr()
    # a user error through the console entry point: one line naming the file, exit status 2

    argv = ["msb", "score", str(tmp_path / "results"), "--layout", "pranet", "--dataset",
            f"Kvasir={tmp_path / 'Kvasir'}", "--semantics", "binary", "--out", str(tmp_path / "scored2")]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exc:
        main()
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "not a binary mask" in err and ".png" in err and "Traceback" not in err


def _write_project():
    spec = importlib.util.spec_from_file_location("_study_conftest", REPO / "tests" / "study" / "conftest.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.write_project


@pytest.mark.slow  # trains a tiny run (~20 s on 2 shared cores)
def test_scored_folder_of_a_trained_run_gives_identical_counts(tmp_path: Path):
    """The stored hard predictions of a trained run's test split, written as (C, H, W) NPY masks and scored
    with the run's split file, give exactly the run's ``msb evaluate`` counts (TP/FP/FN/TN per image x class),
    and ``msb reaggregate`` / ``msb metrics`` read the scored folder."""
    study = _write_project()(tmp_path, {"study": "e2e", "overrides": {"evaluation": {"compute_metrics": False}}})
    r = msb("run", str(study), cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    (rd,) = [p for p in (tmp_path / "runs" / "e2e").iterdir() if (p / "config.yaml").is_file()]
    ev = rd / "evaluation" / "best"
    folder = tmp_path / "export"
    folder.mkdir()
    for f in sorted((ev / "predictions").glob("*.npz")):
        np.save(folder / f"{f.stem}.npy", np.load(f)["pred"])
    ds = load_prepared_dataset(tmp_path / "datasets" / "synthetic", check_files=False)
    res = score_target(find_targets(folder, [str(ds.root)], "flat", "unet_tiny")[0], Semantics("binary"),
                       tmp_path / "scored", split="test", split_file=rd / "split.csv")
    key, cols = ["image_id", "class_id"], ["tp", "fp", "fn", "tn", "height", "width"]
    ours = pd.read_parquet(res.eval_dir / "counts.parquet")
    theirs = pd.read_parquet(ev / "counts.parquet")
    assert len(ours) == len(theirs) > 0
    pd.testing.assert_frame_equal(ours.sort_values(key)[key + cols].reset_index(drop=True),
                                  theirs.sort_values(key)[key + cols].reset_index(drop=True))
    from msb.analysis.counts.aggregate import reaggregate
    from msb.analysis.counts.counts_io import read_counts_with_report

    df, _ = read_counts_with_report([tmp_path / "scored"])  # digests verified, as msb reaggregate reads them
    t = reaggregate(df)
    assert set(t["checkpoint_role"]) == {"scored"} if "checkpoint_role" in t.columns else len(t) > 0
