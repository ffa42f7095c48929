"""``prepare.json`` (msb.data.converters.provenance): written with every prepared dataset, shown by
``msb data validate``, its digest in run manifests; nothing written on error.

Expected values are computed here independently: the changed pixels from the masks the test writes, the
file-list digest with hashlib over ``os.walk``, the groups digest over the CSV bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import cv2
import numpy as np
import pytest
from typer.testing import CliRunner

from msb.data.converters import prepare_dataset
from msb.data.converters.provenance import PREPARE_FILE, prepare_digest, read_prepare
from msb.errors import MSBError


def _png(path: Path, arr: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    assert cv2.imwrite(str(path), arr)


def _source(root: Path) -> Path:
    """3 image/mask pairs; ``b``'s mask holds one stray value-7 pixel, ``c``'s two anti-aliased 128s."""
    for stem in "abc":
        _png(root / "images" / f"{stem}.png", np.full((8, 10, 3), 40, np.uint8))
        m = np.zeros((8, 10), np.uint8)
        m[2:5, 3:7] = 255
        if stem == "b":
            m[0, 0] = 7
        if stem == "c":
            m[6, 1:3] = 128
        _png(root / "masks" / f"{stem}.png", m)
    (root / "groups.csv").write_text("sample_id,group\na,v1\nb,v1\nc,v2\n")
    return root


def _walk_digest(root: Path) -> tuple[int, str]:
    lines = []
    for d, _, files in os.walk(root):
        for f in files:
            p = Path(d) / f
            lines.append(f"{p.relative_to(root).as_posix()}\t{p.stat().st_size}\n")
    lines.sort()
    return len(lines), hashlib.sha256("".join(lines).encode()).hexdigest()


def test_prepare_json_records_threshold_groups_and_changed_pixels(tmp_path: Path) -> None:
    src = _source(tmp_path / "src")
    out = tmp_path / "out"
    report = prepare_dataset("folder", src, out, threshold=127, groups_csv=str(src / "groups.csv"))
    rec = read_prepare(out)
    assert rec["converter"] == "folder" and rec["threshold"] == 127 and rec["format"] == 1
    from msb import __version__

    assert rec["msb_version"] == __version__
    # value 7 -> 0 in b (1 pixel), 128 -> 255 in c (2 pixels); 0 and 255 unchanged
    assert rec["mask_pixels"] == {"n_files": 3, "n_pixels": 240, "n_changed": 3,
                                  "changed_per_file": {"masks/b.png": 1, "masks/c.png": 2}}
    assert report.n_changed_mask_pixels == 3  # the console count and the record agree
    n, digest = _walk_digest(src)
    assert rec["source"] == {"path": str(src.absolute()), "origin": None, "n_files": n,
                             "file_list_sha256": digest}
    assert rec["groups"]["sha256"] == hashlib.sha256((src / "groups.csv").read_bytes()).hexdigest()
    assert rec["groups"]["group_column"] == "group"
    assert rec["options"]["mask_suffix"] == "" and "overwrite" not in rec["options"]  # defaults filled in
    assert prepare_digest(out) == hashlib.sha256((out / PREPARE_FILE).read_bytes()).hexdigest()
    # same inputs, same bytes (no time stamp): the digest identifies the preparation
    prepare_dataset("folder", src, tmp_path / "out2", threshold=127, groups_csv=str(src / "groups.csv"))
    rec2 = read_prepare(tmp_path / "out2")
    assert rec2 == rec
    # a renamed or added source file changes the file-list digest
    (src / "images" / "extra.txt").write_text("x")
    prepare_dataset("folder", src, tmp_path / "out3", threshold=127)
    assert read_prepare(tmp_path / "out3")["source"]["file_list_sha256"] != digest
    assert read_prepare(tmp_path / "out3")["groups"] is None


def test_error_leaves_no_dataset_and_no_record(tmp_path: Path) -> None:
    src = _source(tmp_path / "src")
    _png(src / "masks" / "c.png", np.zeros((5, 5), np.uint8))  # size mismatch -> error
    out = tmp_path / "out"
    with pytest.raises(MSBError, match="same size"):
        prepare_dataset("folder", src, out, threshold=127)
    assert not out.exists() and not any(p.name.startswith(".out.") for p in tmp_path.iterdir())


def test_validate_prints_the_record_and_synth_writes_one(tmp_path: Path) -> None:
    from msb.cli.app import app

    src = _source(tmp_path / "src")
    out = tmp_path / "out"
    prepare_dataset("folder", src, out, threshold=127)
    r = CliRunner().invoke(app, ["data", "validate", str(out)])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert f"prepare.json (sha256 {prepare_digest(out)}): converter 'folder'" in text
    assert "threshold: value > 127 -> foreground" in text
    assert "changed mask pixels: 3 of 240 in 2 of 3 file(s) (masks/b.png: 1, masks/c.png: 2)" in text
    (out / PREPARE_FILE).unlink()
    r = CliRunner().invoke(app, ["data", "validate", str(out)])
    assert r.exit_code == 0 and "no prepare.json" in r.output
    r = CliRunner().invoke(app, ["data", "synth", "--out", str(tmp_path / "syn"), "--n", "4"])
    assert r.exit_code == 0, r.output
    rec = json.loads((tmp_path / "syn" / PREPARE_FILE).read_text())
    assert rec["converter"] == "synthetic" and rec["source"] is None and rec["options"]["n_samples"] == 4


def test_run_manifest_holds_the_prepare_digest(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from msb.engine.runner import write_manifest

    src = _source(tmp_path / "src")
    out = tmp_path / "ds"
    prepare_dataset("folder", src, out, threshold=127)
    run = SimpleNamespace(run_id="r1", config_hash="h", config=SimpleNamespace(
        study="s", data=SimpleNamespace(root=str(out), pool=None)))
    (tmp_path / "run").mkdir()
    write_manifest(tmp_path / "run", run, "cpu")
    m = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert m["prepare_sha256"] == hashlib.sha256((out / PREPARE_FILE).read_bytes()).hexdigest()
    run.config.data.root = str(tmp_path / "nowhere")
    write_manifest(tmp_path / "run", run, "cpu")
    assert json.loads((tmp_path / "run" / "manifest.json").read_text())["prepare_sha256"] is None
