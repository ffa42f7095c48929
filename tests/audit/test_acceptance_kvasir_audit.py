"""Acceptance on real data (../shared/data/kvasir-seg): ``msb audit --fail-on crossing-near-duplicate`` exits 3
across a random ungrouped split and 0 across the group-aware split.

Data: a 100-frame slice of the shared Kvasir-SEG, prepared with the ``kvasir-seg`` converter from a folder of
symlinks: the 12 frames of the six near-identical pairs listed in its PROVENANCE.md plus the first 88 other
frames by file name (the whole set takes ~2 min on 2 shared cores: prepare 35 s, each audit 30-60 s; measured
in docs/audit.md). The converter puts each listed pair into one ``group`` (``neardup_<k>``), so the group-aware
split (``group_column: group``) keeps pairs together; the ungrouped split (same seed) does not.

Independent reference: the listed pairs and the split file (plain pandas). Five of the six pairs are confirmed
at NCC >= 0.95 on 64 px thumbnails (the sixth, cju1gi7jlwyld0835cdf6g6qz / cju5uget8krjy0818kvywd0zu, has
NCC 0.949; PROVENANCE.md says "NCC 0.95", rounded); the expected count of crossing near-duplicate groups is the
number of those five pairs whose two frames the split file puts on different sides.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from msb.cli.app import app
from msb.data.converters import prepare_dataset
from msb.data.schema import load_prepared_dataset
from msb.data.splits import resolve_splits, write_split_file

REPO = Path(__file__).resolve().parents[2]
KVASIR = REPO.parent / "shared" / "data" / "kvasir-seg"
PAIRS = [("cju30bmab08bi0835mvlr6e0r", "cju77k828z46w0871r0avuoo9"),
         ("cju76lsehyia10987u54vn8rb", "cju772304yw5t0818vbw8kkjf"),
         ("cju886ryxnsl50801r93jai7q", "cju8amfdtqi4x09871tygrgqe"),
         ("cju5fydrud94708507vo6oy21", "cju7avvi51iox0817ym55y6tt"),
         ("cju1hhj6mxfp90835n3wofrap", "cju3x9lttikfb0818a0g104zn"),
         ("cju1gi7jlwyld0835cdf6g6qz", "cju5uget8krjy0818kvywd0zu")]
CONFIRMED = PAIRS[:5]


@pytest.fixture(scope="module")
def kvasir_slice(tmp_path_factory) -> Path:
    if not (KVASIR / "images").is_dir():
        pytest.skip(f"real data not found at {KVASIR}: put the shared folder beside the repository root (../shared)")
    root = tmp_path_factory.mktemp("kv")
    listed = {s for p in PAIRS for s in p}
    others = [n for n in sorted(os.listdir(KVASIR / "images")) if n.rsplit(".", 1)[0] not in listed][:88]
    src = root / "src"
    for sub in ("images", "masks"):
        (src / sub).mkdir(parents=True)
        for n in others + [f"{s}.jpg" for s in sorted(listed)]:
            os.symlink(KVASIR / sub / n, src / sub / n)
    out = root / "kvasir_slice"
    prepare_dataset("kvasir-seg", src, out)
    return out


def crossing_confirmed_pairs(split_csv: Path) -> tuple[int, dict[str, int]]:
    side = pd.read_csv(split_csv, dtype=str).set_index("sample_id")["split"]
    by_pair: dict[str, int] = {}
    for a, b in CONFIRMED:
        if side[a] != side[b]:
            key = "|".join(s for s in ("train", "val", "test") if s in (side[a], side[b]))
            by_pair[key] = by_pair.get(key, 0) + 1
    return sum(by_pair.values()), by_pair


@pytest.mark.shared_data
def test_kvasir_random_split_fails_group_aware_split_passes(kvasir_slice: Path, tmp_path: Path) -> None:
    ds = load_prepared_dataset(kvasir_slice)
    assert len(ds.index) == 100
    for name, group_column in (("random", None), ("grouped", "group")):
        write_split_file(tmp_path / f"{name}.csv", resolve_splits(ds.index, "random", 0.2, 0.2, 0, group_column))
    n_cross, by_pair = crossing_confirmed_pairs(tmp_path / "random.csv")
    assert n_cross >= 1  # precondition: the ungrouped split separates at least one listed pair
    assert crossing_confirmed_pairs(tmp_path / "grouped.csv")[0] == 0

    runner = CliRunner()
    r = runner.invoke(app, ["audit", str(kvasir_slice), "--split-file", str(tmp_path / "random.csv"), "--out",
                            str(tmp_path / "a_random"), "--fail-on", "crossing-near-duplicate", "--format", "table"])
    assert r.exit_code == 3, r.stdout
    line = r.stdout.strip().splitlines()[-1]
    assert line.startswith(f"audit verdict: FAIL — {n_cross} of 5 near-duplicate groups cross the split")
    clusters = pd.read_csv(tmp_path / "a_random" / "clusters.csv")
    nd = clusters[clusters.relation == "near_duplicate"]
    assert sorted(tuple(sorted(k.split(";"))) for k in nd["keys"]) == sorted(tuple(sorted(p)) for p in CONFIRMED)
    v = json.loads((tmp_path / "a_random" / "verdict.json").read_text())
    check = next(c for c in v["checks"] if c["check"] == "crossing-near-duplicate")
    assert check["side_pairs"] == by_pair and check["crossing_rows"] == 2 * n_cross

    r = runner.invoke(app, ["audit", str(kvasir_slice), "--split-file", str(tmp_path / "grouped.csv"), "--out",
                            str(tmp_path / "a_grouped"), "--fail-on", "crossing-near-duplicate", "--format", "table"])
    assert r.exit_code == 0, r.stdout
    assert r.stdout.strip().splitlines()[-1] == ("audit verdict: PASS — 0 of 5 near-duplicate groups cross the "
                                                 "split, 0 of 100 rows [crossing-near-duplicate]")
