"""End to end through the command line, every ``msb`` subcommand at least once here or in a test named below.

Here: ``run`` (and its resume), ``evaluate`` (the run's split with ``--force``, and ``--external``),
``reaggregate``, ``metrics``, ``generate``, ``models``, ``data synth`` and ``data validate`` on a tiny project
(tests/study/conftest.py ``write_project``: 24 synthetic 32x32 frames, a 0.3 M-parameter U-Net, one epoch, one
thread), on real Kvasir-SEG (slow), and user errors (one line, exit status 2, no traceback, nothing
half-written). Elsewhere: ``report`` (tests/analysis/test_report.py), ``profile`` (tests/profiling), ``audit``
(tests/audit/test_reports_curation.py), ``data prepare`` (tests/data/test_converters_more.py), ``explain``
(tests/xai/test_explain.py).

Every number is checked against an independent computation: confusion counts recounted with NumPy from the
stored prediction files and the dataset's mask files, Dice recomputed from the counts with pandas, HD95 with
medpy, the config hash with hashlib.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pandas as pd
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def msb(*args: str, cwd: Path = REPO, timeout: int = 900) -> subprocess.CompletedProcess:
    """``python -m msb ARGS`` (captured; offline, one OpenMP thread: 2 threads spin on a busy 2-core machine)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", COLUMNS="200", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "msb", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def msb_in_process(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """``msb ARGS`` in this process (``run_msb_in_process`` of tests/study/conftest.py: the same typer app, click
    parsing and output; no interpreter start-up), for the tests about what a command writes or prints rather than
    about the process (exit status 2 / 130, one error line: those use :func:`msb`)."""
    spec = importlib.util.spec_from_file_location("_study_conftest_ip", REPO / "tests" / "study" / "conftest.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.run_msb_in_process(*args, cwd=cwd)


def _write_project():
    """``write_project`` of tests/study/conftest.py (loaded by path: test folders are not packages)."""
    spec = importlib.util.spec_from_file_location("_study_conftest", REPO / "tests" / "study" / "conftest.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.write_project


# ----------------------------------------------------------------------------- independent recomputations
def _class_values(dataset_root: Path) -> dict[int, list[int]]:
    """Foreground class id -> raw mask values, read from classes.csv with pandas."""
    cls = pd.read_csv(dataset_root / "classes.csv", dtype={"source_values": str})
    return {int(r.class_id): [int(v) for v in str(r.source_values).split(";")]
            for r in cls.itertuples() if int(r.class_id) != 0}


def _reference(dataset_root: Path, image_id: str, class_id: int) -> np.ndarray:
    """Reference mask of one class, read from the dataset's mask file (not from the prediction file)."""
    index = pd.read_csv(dataset_root / "index.csv", dtype=str).set_index("sample_id")
    mask = cv2.imread(str(dataset_root / index.loc[image_id, "mask_path"]), cv2.IMREAD_UNCHANGED)
    assert mask is not None and mask.ndim == 2
    return np.isin(mask, _class_values(dataset_root)[class_id])


def _recount(eval_dir: Path, dataset_root: Path) -> pd.DataFrame:
    """tp, fp, fn, tn, height, width per image x class: the stored prediction (``predictions/<id>.npz`` key
    ``pred``) against the dataset's mask file, TP = sum(pred & ref) etc."""
    rows = []
    for npz in sorted((eval_dir / "predictions").glob("*.npz")):
        with np.load(npz) as z:
            pred, class_ids = z["pred"].astype(bool), z["class_ids"].reshape(-1)
        for k, c in enumerate(class_ids):
            p, r = pred[k], _reference(dataset_root, npz.stem, int(c))
            assert p.shape == r.shape
            rows.append({"image_id": npz.stem, "class_id": int(c), "tp": int((p & r).sum()),
                         "fp": int((p & ~r).sum()), "fn": int((~p & r).sum()), "tn": int((~p & ~r).sum()),
                         "height": r.shape[0], "width": r.shape[1]})
    return pd.DataFrame(rows)


def _assert_counts_match_files(counts: pd.DataFrame, eval_dir: Path, dataset_root: Path) -> None:
    cols = ["tp", "fp", "fn", "tn", "height", "width"]
    expected = _recount(eval_dir, dataset_root).sort_values(["image_id", "class_id"]).reset_index(drop=True)
    got = counts.sort_values(["image_id", "class_id"]).reset_index(drop=True)
    assert list(got["image_id"]) == list(expected["image_id"]) and len(got) > 0
    pd.testing.assert_frame_equal(got[cols].astype("int64"), expected[cols].astype("int64"))


def _dice_by_hand(counts: pd.DataFrame) -> dict[str, tuple[float, int]]:
    """Dice under the three basic rules from a counts table, with the number of undefined (0/0) units."""
    c = counts.astype({"tp": "int64", "fp": "int64", "fn": "int64"})
    den = 2 * c["tp"] + c["fp"] + c["fn"]
    per_row = (2 * c["tp"] / den.where(den > 0)).rename("dice")
    per_class_mean = per_row.groupby(c["class_id"]).mean()  # pandas' mean skips NaN
    sums = c.groupby("class_id")[["tp", "fp", "fn"]].sum()
    sums_den = 2 * sums["tp"] + sums["fp"] + sums["fn"]
    tp, fp, fn = (int(c[k].sum()) for k in ("tp", "fp", "fn"))
    return {"global-micro": (2 * tp / (2 * tp + fp + fn), int(2 * tp + fp + fn == 0)),
            "image-macro": (float(per_class_mean.mean()), int((den == 0).sum())),
            "class-macro": (float((2 * sums["tp"] / sums_den.where(sums_den > 0)).mean()), int((sums_den == 0).sum()))}


def _printed_tables(stdout: str) -> list[pd.DataFrame]:
    """The rich tables printed on stdout (header row ``┃ ... ┃``, body rows ``│ ... │``), cells as text."""
    tables, header, rows = [], None, []
    for line in stdout.splitlines() + [""]:
        t = line.strip()
        if t.startswith("┃"):
            header, rows = [c.strip() for c in t.strip("┃").split("┃")], []
        elif t.startswith("│") and header is not None:
            rows.append([c.strip() for c in t.strip("│").split("│")])
        elif t.startswith("└") and header is not None:
            tables.append(pd.DataFrame(rows, columns=header))
            header = None
    return tables


def _dice_cell(value: float, excluded: int) -> str:
    """How render_scores_table prints a Dice value: 4 decimals, ``(-k)`` when k units were undefined."""
    return f"{value:.4f}" + (f" (-{excluded})" if excluded else "")


# ---------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def tiny_study(tmp_path_factory) -> Path:
    """A copy of the shipped configs with a tiny synthetic study (2 epochs, 64x64; the Ctrl-C test trains
    it for 50 epochs and interrupts it)."""
    root = tmp_path_factory.mktemp("proj")
    cfg = root / "configs"
    (cfg / "datasets").mkdir(parents=True)
    (cfg / "architectures").mkdir()
    (cfg / "global.yaml").write_text((REPO / "configs" / "global.yaml").read_text())
    ds = yaml.safe_load((REPO / "configs" / "datasets" / "synthetic.yaml").read_text())
    ds["data"]["root"] = str(root / "datasets" / "synthetic")
    ds["data"]["prepare"]["options"] = {"n_samples": 40, "seed": 0}
    ds["data"]["input_size"] = [64, 64]
    (cfg / "datasets" / "synthetic.yaml").write_text(yaml.safe_dump(ds))
    (cfg / "architectures" / "unet_r18.yaml").write_text((REPO / "configs" / "architectures" / "unet_r18.yaml").read_text())
    study = {"study": "tiny", "run_root": str(root / "runs"), "datasets": ["synthetic"], "architectures": ["unet_r18"],
             "overrides": {"train": {"epochs": 2, "batch_size": 8}, "evaluation": {"checkpoint": "both"}}}
    (cfg / "study.yaml").write_text(yaml.safe_dump(study))
    return cfg / "study.yaml"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """``msb run`` of a tiny project (one run; best and latest evaluated; metrics.parquet NOT computed, so
    ``msb metrics`` has to write it; HD convention ``medpy``). Returns (project root, study file, run folder,
    the CompletedProcess of ``msb run``)."""
    root = tmp_path_factory.mktemp("e2e")
    study = _write_project()(root, {"study": "e2e", "overrides": {"evaluation": {
        "checkpoint": "both", "compute_metrics": False, "metrics": {"hd_convention": "medpy"}}}})
    # the terminal tables (stdout is a pipe here: csv by default); --verbose: the full scores table too
    r = msb("run", str(study), "--format", "table", "--verbose")
    assert r.returncode == 0, r.stdout + r.stderr
    run_dirs = [p for p in (root / "runs" / "e2e").iterdir() if (p / "config.yaml").is_file()]
    assert len(run_dirs) == 1
    return root, study, run_dirs[0], r


# ----------------------------------------------------------------------------------------------- tests
@pytest.mark.slow  # ~25 s with the training of the fixture
def test_run_evaluate_reaggregate_chain(trained):
    root, study, rd, r = trained
    data = root / "datasets" / "synthetic"
    for f in ["config.yaml", "config.sha256", "split.csv", "manifest.json", "train_log.csv",
              "checkpoints/best.pt", "checkpoints/latest.pt", "checkpoints/records.json",
              "evaluation/best/counts.parquet", "evaluation/latest/counts.parquet"]:
        assert (rd / f).is_file(), f
    counts = {role: pd.read_parquet(rd / "evaluation" / role / "counts.parquet") for role in ("best", "latest")}
    split = pd.read_csv(rd / "split.csv")
    test_ids = sorted(split.loc[split["split"] == "test", "sample_id"])
    for role, c in counts.items():
        assert sorted(c["image_id"]) == test_ids and len(test_ids) > 0  # one class: one row per test image
        assert set(c["checkpoint_role"]) == {role}
        assert (c["config_hash"] == (rd / "config.sha256").read_text().strip()).all()
        # counts = the stored predictions recounted against the dataset's mask files
        _assert_counts_match_files(c, rd / "evaluation" / role, data)

    # what `msb run` prints: the score table of every evaluated checkpoint (Dice recomputed from the counts),
    # then the leaderboard of the study's systems (here one run x two checkpoint roles)
    table, board = _printed_tables(r.stdout)
    ds = str(counts["best"]["dataset"].iloc[0])
    labels = [f"{rd.name.removeprefix(ds + '-')}@{role}" for role in ("best", "latest")]
    key = ["image_id", "class_id", "tp", "fp", "fn", "tn", "checkpoint_sha256"]
    same = counts["best"][key].sort_values(key).reset_index(drop=True).equals(
        counts["latest"][key].sort_values(key).reset_index(drop=True))  # best = latest epoch: one checkpoint
    assert sorted(board["system"]) == (labels[:1] if same else labels), r.stdout
    assert (f"{labels[1]} is identical to {labels[0]} (same checkpoint SHA-256" in r.stdout) == same
    printed = table.set_index(["checkpoint_role", "aggregation"])
    assert set(printed.index) == {(role, rule) for role in ("best", "latest")
                                  for rule in ("global-micro", "image-macro", "class-macro")}, r.stdout
    for role, c in counts.items():
        for rule, (value, excluded) in _dice_by_hand(c).items():
            assert printed.loc[(role, rule), "images"] == str(len(test_ids))
            assert printed.loc[(role, rule), "Dice"] == _dice_cell(value, excluded), (role, rule, r.stdout)

    # rerun = resume: nothing trained or evaluated again
    r2 = msb("run", str(study))
    assert r2.returncode == 0, r2.stderr
    assert "already finished" in r2.stdout and "already done" in r2.stdout

    # msb evaluate: reload the best checkpoint (SHA-256 verified) and write the same counts again
    done = rd / "evaluation" / "best" / "DONE"
    done_before = done.stat().st_mtime_ns
    r3 = msb("evaluate", str(rd), "--checkpoint", "best", "--force", "--format", "table")
    assert r3.returncode == 0, r3.stdout + r3.stderr
    assert "already done" not in r3.stdout + r3.stderr and done.stat().st_mtime_ns != done_before  # really re-evaluated
    again = pd.read_parquet(rd / "evaluation" / "best" / "counts.parquet")
    key = ["image_id", "class_id"]
    pd.testing.assert_frame_equal(again.sort_values(key).reset_index(drop=True),
                                  counts["best"].sort_values(key).reset_index(drop=True))
    _assert_counts_match_files(again, rd / "evaluation" / "best", data)
    (table,) = _printed_tables(r3.stdout)
    shown = table.set_index("aggregation")
    for rule, (value, excluded) in _dice_by_hand(again).items():
        assert shown.loc[rule, "Dice"] == _dice_cell(value, excluded), r3.stdout

    # reaggregate from stored counts alone: Dice equal to the hand computation from the counts files
    out = root / "scores_out"
    r4 = msb("reaggregate", str(root / "runs" / "e2e"), "--out", str(out))
    assert r4.returncode == 0, r4.stderr
    scores = pd.read_csv(out / "scores.csv")
    assert set(scores["aggregation"]) == {"global-micro", "image-macro", "class-macro"}
    assert set(scores["checkpoint_role"]) == {"best", "latest"}
    dice = scores[scores["metric"] == "dice"].set_index(["checkpoint_role", "aggregation"])
    assert len(dice) == 6
    for role in ("best", "latest"):
        c = pd.read_parquet(rd / "evaluation" / role / "counts.parquet")
        for rule, (value, excluded) in _dice_by_hand(c).items():
            assert dice.loc[(role, rule), "value"] == pytest.approx(value, abs=1e-12)
            assert dice.loc[(role, rule), "n_excluded"] == excluded


def test_metrics_command_hd95_matches_medpy(trained):
    """``msb metrics RUN`` writes metrics.parquet from the stored predictions; the run config asks for the medpy
    HD convention (HD95 = 95th percentile of both directions' distances pooled), so every HD95 of two
    non-empty masks equals medpy.metric.binary.hd95 on the stored prediction and the dataset's mask file."""
    from medpy.metric.binary import hd95

    root, _, rd, _ = trained
    data = root / "datasets" / "synthetic"
    assert not list(rd.glob("evaluation/*/metrics.parquet"))  # compute_metrics: false in the run config
    r = msb_in_process("metrics", str(rd), "--format", "table")  # the terminal tables (piped stdout is csv by default)
    assert r.returncode == 0, r.stdout + r.stderr
    n_checked = 0
    tables = _printed_tables(r.stdout)
    assert len(tables) == 2  # one summary per evaluated checkpoint, best then latest
    for role, table in zip(("best", "latest"), tables):
        m = pd.read_parquet(rd / "evaluation" / role / "metrics.parquet")
        counts = pd.read_parquet(rd / "evaluation" / role / "counts.parquet")
        assert sorted(m["image_id"]) == sorted(counts["image_id"])
        assert set(m["hd_convention"]) == {"medpy"}
        for row in m.itertuples():
            with np.load(rd / "evaluation" / role / "predictions" / f"{row.image_id}.npz") as z:
                pred = z["pred"][list(z["class_ids"]).index(row.class_id)]
                spacing = tuple(z["spacing"])
            ref = _reference(data, row.image_id, row.class_id)
            assert (row.n_pred_px, row.n_ref_px) == (int(pred.sum()), int(ref.sum()))
            if pred.any() and ref.any():
                assert row.empty_case == "none"
                # medpy's default connectivity=1 is the 4-neighbourhood boundary of the run's metrics config
                assert row.hd95 == pytest.approx(hd95(pred, ref, voxelspacing=spacing, connectivity=1),
                                                 rel=1e-12, abs=1e-12), row.image_id
                n_checked += 1
        # the printed summary: image mean of hd95 over the rows with a value, under the convention shown
        assert f"{role}/metrics.parquet (convention: medpy; distances in px)" in r.stdout  # no spacing in index.csv
        shown = table[(table["metric"] == "hd95_px") & (table["aggregation"] == "image_mean")]
        assert len(shown) == 1 and shown["hd_convention"].iloc[0] == "medpy", r.stdout
        assert shown["value"].iloc[0] == f"{m['hd95'].mean():.4f}", r.stdout
        assert shown["n_used"].iloc[0] == str(int(m["hd95"].notna().sum()))
    assert n_checked >= 1  # at least one image with both masks non-empty was compared with medpy


def test_metrics_command_card_option(trained):
    """``msb metrics RUN --card`` adds the card's recipe as written beside the real HD95 (same rows, the run's
    medpy convention); the card's "HD95" equals its literal cdist formula on the stored masks."""
    from scipy.spatial.distance import cdist

    root, _, rd, _ = trained
    data = root / "datasets" / "synthetic"
    r = msb_in_process("metrics", str(rd), "--card")
    assert r.returncode == 0, r.stdout + r.stderr
    m = pd.read_parquet(rd / "evaluation" / "best" / "metrics.parquet")
    assert {"hd95", "card_hd95_as_written", "card_dice_as_written", "card_hd95_refused"} <= set(m.columns)
    assert set(m["hd_convention"]) == {"medpy"} and "card_hd95_as_written" in r.stdout
    n_checked = 0
    for row in m.itertuples():
        with np.load(rd / "evaluation" / "best" / "predictions" / f"{row.image_id}.npz") as z:
            pred = z["pred"][list(z["class_ids"]).index(row.class_id)]
        ref = _reference(data, row.image_id, row.class_id)
        if pred.any() and ref.any():
            literal = np.percentile(np.max(cdist(np.argwhere(pred), np.argwhere(ref)), axis=1), 95)
            assert row.card_hd95_as_written == literal and row.card_hd95_refused == ""
            n_checked += 1
        else:
            assert np.isnan(row.card_hd95_as_written) and "empty" in row.card_hd95_refused
    assert n_checked >= 1


def test_evaluate_external_dataset(trained):
    """``msb evaluate RUN --external synth_ext`` (configs/datasets/synth_ext.yaml of the project, run from the
    project folder): 6 synthetic 40x40 frames, prepared on first use. Rows = images x foreground classes, all
    labelled with the external name; counts recounted from the stored predictions and the external masks."""
    root, _, rd, _ = trained
    r = msb_in_process("evaluate", str(rd), "--external", "synth_ext", "--format", "table", cwd=root)
    assert r.returncode == 0, r.stdout + r.stderr
    ext_dir = rd / "evaluation" / "external" / "synth_ext" / "best"
    counts = pd.read_parquet(ext_dir / "counts.parquet")
    ext_root = root / "datasets" / "synth_ext"
    n_images = len(pd.read_csv(ext_root / "index.csv"))
    n_classes = len(_class_values(ext_root))
    assert n_images == 6 and n_classes == 1  # as write_project declares synth_ext
    assert len(counts) == n_images * n_classes
    assert set(counts["dataset"]) == {"synth_ext"} and set(counts["split"]) == {"all"}
    assert set(counts["checkpoint_role"]) == {"best"} and (counts["height"] == 40).all()
    _assert_counts_match_files(counts, ext_dir, ext_root)
    (table,) = _printed_tables(r.stdout)
    shown = table.set_index("aggregation")
    for rule, (value, excluded) in _dice_by_hand(counts).items():
        assert shown.loc[rule, "images"] == str(n_images), r.stdout
        assert shown.loc[rule, "Dice"] == _dice_cell(value, excluded), r.stdout


def test_generate_prints_the_hash_of_the_run_config(trained, tmp_path: Path):
    """``msb generate``: the config hash it prints is the SHA-256 of the canonical JSON of the written
    config.yaml without run_root (recomputed with hashlib), and the run is the one ``msb run`` trained."""
    _, study, rd, _ = trained
    r = msb_in_process("generate", str(study), "--run-root", str(tmp_path / "gen"))
    assert r.returncode == 0, r.stdout + r.stderr
    written = tmp_path / "gen" / "e2e" / rd.name / "config.yaml"
    cfg = yaml.safe_load(written.read_text())
    cfg.pop("run_root", None)
    digest = hashlib.sha256(json.dumps(cfg, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()
    (table,) = _printed_tables(r.stdout)
    assert table[["run_id", "config_hash"]].values.tolist() == [[rd.name, digest[:16]]]
    assert rd.name.endswith(digest[:8]) and (rd / "config.sha256").read_text().strip() == digest


def test_explain_two_images_after_one_flag(trained, tmp_path: Path):
    """``msb explain RUN --images A B``: click hands B to the RUN arguments; the command must take it back as an
    image id. The Grad-CAM prediction of a test image is the evaluated prediction: its area equals the stored
    prediction's pixel count."""
    _, _, rd, _ = trained
    counts = pd.read_parquet(rd / "evaluation" / "best" / "counts.parquet")
    ids = sorted(counts["image_id"])[:2]
    r = msb("explain", str(rd), "--images", *ids, "--device", "cpu", "--out", str(tmp_path / "x"))
    assert r.returncode == 0, r.stdout + r.stderr
    table = pd.read_csv(tmp_path / "x" / "explain.csv")
    assert sorted(table["image_id"]) == ids and set(table["image_split"]) == {"test"}
    for row in table.itertuples():
        with np.load(rd / "evaluation" / "best" / "predictions" / f"{row.image_id}.npz") as z:
            assert row.pred_area_px == int(z["pred"][0].sum()), row.image_id


def test_models_lists_the_registry():
    """`msb models`: one row per architecture config (csv when piped), each naming a registered adapter; the last
    line lists every registry adapter. In-process (typer's CliRunner, stdout and stderr captured apart, neither
    a terminal); the same command as a real piped process: tests/e2e/test_cli_formats_pipes.py."""
    import io

    from typer.testing import CliRunner

    from msb.cli.app import app
    from msb.models.registry import available_architectures

    r = CliRunner().invoke(app, ["models", "--configs", str(REPO / "configs")])
    assert r.exit_code == 0 and r.exception is None, (r.output, r.exception)
    table, tail = r.stdout, r.stderr.split("registry adapters: ")[1]  # piped: the csv on stdout, notes on stderr
    printed = tail.strip().split(", ")
    assert printed == available_architectures()
    assert {"unet", "pranet", "polyp_pvt", "sanet", "pvt_cascade", "segformer", "g_cascade"} <= set(printed)
    shown = pd.read_csv(io.StringIO(table))
    assert len(shown) == len(list((REPO / "configs" / "architectures").glob("*.yaml")))
    assert set(shown["adapter"]) <= set(printed)


def test_data_synth_and_validate(tmp_path: Path):
    out = tmp_path / "synth8"
    r = msb("data", "synth", "--out", str(out), "--n", "8")
    assert r.returncode == 0, r.stdout + r.stderr
    index = pd.read_csv(out / "index.csv")
    assert len(index) == 8 and index["sample_id"].is_unique
    for mp in index["mask_path"]:  # every mask holds only the values classes.csv declares
        mask = cv2.imread(str(out / mp), cv2.IMREAD_UNCHANGED)
        assert set(np.unique(mask)) <= {0, *[v for vs in _class_values(out).values() for v in vs]}
    r = msb("data", "validate", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "8 samples, 1 foreground class(es): OK" in r.stdout

    # a corrupted copy: one mask pixel with a value classes.csv does not declare
    bad = tmp_path / "corrupt"
    shutil.copytree(out, bad)
    victim = bad / index["mask_path"].iloc[3]
    mask = cv2.imread(str(victim), cv2.IMREAD_UNCHANGED)
    mask[0, 0] = 7
    assert cv2.imwrite(str(victim), mask)
    r = msb("data", "validate", str(bad))
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and str(victim) in lines[0] and "7 (1 px)" in lines[0], r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def test_user_errors_are_one_line(tmp_path: Path, tiny_study: Path):
    bad = tmp_path / "configs"
    bad.mkdir()
    (bad / "global.yaml").write_text("train: {epochz: 3}\n")
    (bad / "study.yaml").write_text("study: x\ndatasets: [a]\narchitectures: [b]\n")
    r = msb("generate", str(bad / "study.yaml"))
    assert r.returncode == 2
    err = r.stderr.strip()
    assert "Traceback" not in err and "global.yaml" in err and "train.epochz" in err and "train.epochs" in err
    r = msb("evaluate", str(tmp_path / "nope"))
    assert r.returncode == 2 and "nope: no such folder" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / "empty").mkdir()
    r = msb("evaluate", str(tmp_path / "empty"))
    assert r.returncode == 2 and "not a run folder (no config.yaml)" in r.stderr
    r = msb("nosuchcommand")
    assert r.returncode == 2 and "No such command" in r.stderr and "Traceback" not in r.stderr
    r = msb("reaggregate", str(tmp_path / "missing.parquet"))
    assert r.returncode == 2 and "missing.parquet" in r.stderr
    r = msb("--debug", "reaggregate", str(tmp_path / "missing.parquet"))
    assert r.returncode != 0 and "Traceback" in r.stderr


@pytest.mark.slow
def test_kvasir_ci_variant(shared_dir: Path, tmp_path: Path):
    """The CI variant of configs/studies/kvasir_unet_cpu.yaml: converter + chain + artifacts on real data."""
    if not (shared_dir / "data" / "kvasir-seg" / "images").is_dir():
        pytest.skip("../shared/data/kvasir-seg not found")
    # the dataset is prepared into tmp_path, not datasets/kvasir_seg of the source tree
    study = tmp_path / "kvasir_unet_ci.yaml"
    study.write_text(yaml.safe_dump({
        "_base_": str(REPO / "configs" / "studies" / "kvasir_unet_ci.yaml"), "configs_root": str(REPO / "configs"),
        "overrides": {"data": {"root": str(tmp_path / "datasets" / "kvasir_seg"),
                               "prepare": {"converter": "kvasir-seg",
                                           "source": str(shared_dir / "data" / "kvasir-seg")}}}}))
    r = msb("run", str(study), "--run-root", str(tmp_path / "runs"))
    assert r.returncode == 0, r.stdout + r.stderr
    counts_files = list((tmp_path / "runs" / "kvasir_unet_ci").glob("*/evaluation/best/counts.parquet"))
    assert len(counts_files) == 1
    df = pd.read_parquet(counts_files[0])
    assert len(df) == 16 and set(df["dataset"]) == {"kvasir_seg"}
    # native resolution: Kvasir images are at least 332 px wide
    assert (df["width"] >= 332).all() and (df["reference"] > 0).all()
    metrics = counts_files[0].parent / "metrics.parquet"
    assert metrics.is_file() and len(pd.read_parquet(metrics)) == 16


def test_ctrl_c_exits_130_and_rerun_resumes(tiny_study: Path, tmp_path: Path):
    """SIGINT during training: 'aborted', exit status 130; the rerun continues from the last finished epoch."""
    import signal
    import time

    study = yaml.safe_load(tiny_study.read_text())
    study.update({"study": "interrupt", "run_root": str(tmp_path / "runs"),
                  "overrides": {"train": {"epochs": 50, "batch_size": 8}}})
    path = tiny_study.parent / "interrupt.yaml"
    path.write_text(yaml.safe_dump(study))
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.Popen([sys.executable, "-m", "msb", "run", str(path)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not list((tmp_path / "runs").glob("interrupt/*/state/train_state.pt")):
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, out + err
    assert "aborted" in err and "Traceback" not in err
    log_lines = (next((tmp_path / "runs").glob("interrupt/*/train_log.csv"))).read_text().splitlines()
    done = len(log_lines) - 1
    assert 1 <= done < 50
    # the rerun resumes (the same config: the epoch budget is part of the hash); stop it quickly again
    proc = subprocess.Popen([sys.executable, "-m", "msb", "run", str(path)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while len(next((tmp_path / "runs").glob("interrupt/*/train_log.csv")).read_text().splitlines()) - 1 <= done:
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130
    # train_log.csv is written just before the resume state, so the state may lag the log by one epoch
    assert f"resuming from epoch {done + 1}" in out or f"resuming from epoch {done}" in out
