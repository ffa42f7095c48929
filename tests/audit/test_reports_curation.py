"""Audit reports (CSV/XLSX/HTML/JSON), decisions -> curated dataset, audit clusters -> groups (splits, K-fold),
and the ``msb audit`` command line."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import openpyxl
import pandas as pd
import pytest
from sklearn.model_selection import GroupKFold

from msb.audit.curate import apply_decisions, cluster_decisions, read_decisions
from msb.audit.pipeline import audit_dataset
from msb.audit.report import write_audit
from msb.data.schema import load_prepared_dataset
from msb.data.splits import resolve_splits
from msb.errors import MSBError

REPO = Path(__file__).resolve().parents[2]
NEAR_COPIES = [("a", "copy_a"), ("b", "b_small"), ("c", "c_shift"), ("d", "d_dup")]


def digest_tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_reports_written(planted_result, tmp_path: Path) -> None:
    out = tmp_path / "audit"
    written = write_audit(planted_result, out)
    names = sorted(p.name for p in written)
    assert names == sorted(["census.csv", "pairs.csv", "clusters.csv", "images.csv", "audit.xlsx",
                            "contact_sheet.html", "audit.json", "decisions_template.csv", "counterparts.csv",
                            "verdict.json", "predicates.csv", "calibration.csv", "group_links.csv", "fov_mask.png"])
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []  # no temporary leftovers
    census = pd.read_csv(out / "census.csv")
    wb = openpyxl.load_workbook(out / "audit.xlsx", read_only=True)
    assert wb.sheetnames == ["census", "counterparts", "pairs", "clusters", "images", "parameters"]
    assert wb["census"].max_row == len(census) + 1 and wb["pairs"].max_row == 4 + 1 and wb["images"].max_row == 13
    html = (out / "contact_sheet.html").read_text()
    assert html.count("data:image/png;base64,") == 2 * 4 + 1  # the pairs and the content mask (fov_mask.png)
    assert "copy_a" in html and "shifted" not in html.lower().replace("shifted_c", "")  # keys, not file names
    assert "4 of 4 shown" in html and "64x64 px" in html
    params = json.loads((out / "audit.json").read_text())
    assert params["config"]["hamming_k"] == 8 and params["n_candidate_pairs"] == 4
    assert "INTER_AREA" in params["screens"] and params["candidate_generator"] == "all"  # auto: 12 rows <= 20,000
    assert params["candidate_rule"] == ("every pair compared: NCC >= 0.95 on 64x64 px thumbnails (66 pairs), or "
                                        "pHash Hamming distance <= 8 or dHash Hamming distance <= 8 (64-bit hashes)")
    clusters = pd.read_csv(out / "clusters.csv")
    nd = clusters[clusters.relation == "near_duplicate"]
    assert sorted(nd["n_rows"]) == [2, 2, 2, 2] and int(nd["crosses"].sum()) == 3
    tmpl = pd.read_csv(out / "decisions_template.csv", keep_default_na=False)
    assert len(tmpl) == 8 and set(tmpl.action) == {"group"}


def test_cluster_groups_keep_near_copies_together(planted: Path, planted_result, tmp_path: Path) -> None:
    before = digest_tree(planted)
    dec = cluster_decisions(planted_result)
    f = tmp_path / "dec.csv"
    dec.to_csv(f, index=False)
    rep = apply_decisions(planted, f, tmp_path / "curated")
    assert digest_tree(planted) == before  # the source dataset is untouched
    assert (rep.n_rows_in, rep.n_dropped, rep.n_regrouped, rep.n_groups_before, rep.n_groups_after) == (12, 0, 8, 3, 6)
    ds = load_prepared_dataset(tmp_path / "curated", check_files=True)
    g = dict(zip(ds.index.sample_id, ds.index.group))
    assert g["a"] == g["copy_a"] == "audit-near_duplicate-0"
    assert g["b"] == g["b_small"] == "audit-near_duplicate-1"
    assert g["c"] == g["c_shift"] == "audit-near_duplicate-2+patient3"  # merged with c's existing group
    assert g["d"] == g["d_dup"] == "audit-near_duplicate-3"
    assert (g["e"], g["f"], g["g"], g["h"]) == ("patient7", "patient7", "patient9", "patient9")
    # paths point at the original files
    assert ds.image_path("copy_a").resolve() == (planted / "images/test/copy_of_a.png").resolve()
    assert ds.index.image_path.str.startswith("../").all() and ds.index.image_path.str.endswith(".png").sum() == 11
    log = pd.read_csv(tmp_path / "curated" / "curation.csv", keep_default_na=False)
    c_row = log[log.sample_id == "c"].iloc[0]
    assert (c_row.action, c_row.old_group, c_row.new_group) == ("regrouped", "patient3", "audit-near_duplicate-2+patient3")
    assert "near_duplicate cluster 2" in c_row.reason and "merged labels" in c_row.reason
    # group-aware random splits and K-fold never separate near-copies
    for seed in range(5):
        s = resolve_splits(ds.index, "random", 0.25, 0.25, seed=seed, group_column="group")
        assert all(s[x] == s[y] for x, y in NEAR_COPIES)
    keys = np.where(ds.index.group != "", ds.index.group, "row:" + ds.index.sample_id)
    fold = {}
    for k, (_, test) in enumerate(GroupKFold(n_splits=3).split(ds.index, groups=keys)):
        fold.update({ds.index.sample_id.iat[t]: k for t in test})
    assert all(fold[x] == fold[y] for x, y in NEAR_COPIES)


def test_user_decisions_drop_keep_merge(planted: Path, tmp_path: Path) -> None:
    f = tmp_path / "dec.csv"
    f.write_text("sample_id,action,reason,target\n"
                 "copy_a,drop,byte copy of a,\n"
                 "b_small,keep,reviewed: resized copy is acceptable in val,\n"
                 "e,group,same patient per report,same_patient\n"
                 "h,group,same patient per report,same_patient\n")
    rep = apply_decisions(planted, f, tmp_path / "cur")
    assert (rep.n_dropped, rep.n_regrouped, rep.n_kept_decisions) == (1, 4, 1)
    ds = load_prepared_dataset(tmp_path / "cur")
    assert "copy_a" not in ds.sample_ids and len(ds) == 11
    g = dict(zip(ds.index.sample_id, ds.index.group))
    assert g["e"] == g["f"] == g["g"] == g["h"] == "patient7+patient9+same_patient"
    log = pd.read_csv(tmp_path / "cur" / "curation.csv", keep_default_na=False).set_index("sample_id")
    assert log.loc["copy_a", "action"] == "dropped" and log.loc["copy_a", "reason"] == "byte copy of a"
    assert log.loc["copy_a", "decision_line"] == "2"
    assert log.loc["b_small", "action"] == "kept"
    assert log.loc["g", "action"] == "regrouped" and log.loc["g", "decision_line"] == ""
    info = json.loads((tmp_path / "cur" / "curation.json").read_text())
    assert info["decisions_sha256"] == hashlib.sha256(f.read_bytes()).hexdigest()
    assert info["source_index_sha256"] == hashlib.sha256((planted / "index.csv").read_bytes()).hexdigest()


def test_groups_from_clusters_merges_without_splitting() -> None:
    from msb.audit.curate import groups_from_clusters

    index = pd.DataFrame({"sample_id": ["s1", "s2", "s3", "s4", "s5", "s6"],
                          "group": ["v1", "v1", "v2", "", "", ""]})
    # cluster A links s2 (video v1) with s3 (video v2): v1 and v2 must become one group; cluster B = {s4, s5}
    new, merged = groups_from_clusters(index, {"s2": "A", "s3": "A", "s4": "B", "s5": "B"})
    assert new.tolist() == ["A+v1+v2", "A+v1+v2", "A+v1+v2", "B", "B", ""]
    assert merged == {"A+v1+v2": ["A", "v1", "v2"]}


@pytest.mark.parametrize("body,match", [
    ("zzz,drop,why,\n", r"line 2: sample_id 'zzz' is not in the dataset"),
    ("a,delete,why,\n", r"line 2: action 'delete' is not one of drop, group, keep"),
    ("a,drop,,\n", r"line 2: empty reason"),
    ("a,group,why,\n", r"line 2: action 'group' needs a target"),
    ("a,drop,why,\na,keep,why,\n", r"line 3: sample_id 'a' already decided on line 2"),
])
def test_bad_decisions_leave_nothing(planted: Path, tmp_path: Path, body: str, match: str) -> None:
    f = tmp_path / "dec.csv"
    f.write_text("sample_id,action,reason,target\n" + body)
    with pytest.raises(MSBError, match=match):
        apply_decisions(planted, f, tmp_path / "cur")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dec.csv"]


def test_decisions_file_errors(planted: Path, tmp_path: Path) -> None:
    with pytest.raises(MSBError, match="decisions file .*missing.csv not found"):
        read_decisions(tmp_path / "missing.csv")
    (tmp_path / "x.csv").write_text("sample_id,verdict\na,drop\n")
    with pytest.raises(MSBError, match=r"missing column\(s\) \['action', 'reason'\]"):
        read_decisions(tmp_path / "x.csv")
    every = tmp_path / "all.csv"
    ids = pd.read_csv(planted / "index.csv").sample_id
    every.write_text("sample_id,action,reason\n" + "".join(f"{s},drop,x\n" for s in ids))
    with pytest.raises(MSBError, match="every row .* would be dropped"):
        apply_decisions(planted, every, tmp_path / "cur")
    assert not (tmp_path / "cur").exists()


def test_pipeline_apply_clusters_with_user_override(planted: Path, tmp_path: Path) -> None:
    f = tmp_path / "dec.csv"
    f.write_text("sample_id,action,reason\ncopy_a,drop,byte copy\n")
    res = audit_dataset(planted, out=tmp_path / "audit", apply=f, apply_clusters=True,
                        curated_out=tmp_path / "cur")
    applied = pd.read_csv(tmp_path / "audit" / "decisions_applied.csv", keep_default_na=False)
    assert len(applied) == 8 and applied.set_index("sample_id").loc["copy_a", "action"] == "drop"
    assert res.curation is not None and res.curation.n_dropped == 1 and res.curation.n_regrouped == 7
    g = dict(zip(*[load_prepared_dataset(tmp_path / "cur").index[c] for c in ("sample_id", "group")]))
    assert g["a"] == "audit-near_duplicate-0" and "copy_a" not in g
    with pytest.raises(MSBError, match="without --against"):
        audit_dataset(planted, against=tmp_path, apply_clusters=True)


def msb(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "msb", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)


def test_cli_audit_and_errors(planted: Path, tmp_path: Path) -> None:
    r = msb("audit", str(planted), "--out", str(tmp_path / "a"), "--apply-clusters", "--curated-out",
            str(tmp_path / "cur"), "--format", "table")  # the human census ("3 / 4") and summary on stdout
    assert r.returncode == 0, r.stdout + r.stderr
    assert "near_duplicate" in r.stdout and "3 / 4" in r.stdout and "6 / 12" in r.stdout
    assert "12 of 12 rows kept (0 dropped), 8 row(s) regrouped" in " ".join(r.stdout.split())
    assert (tmp_path / "a" / "contact_sheet.html").is_file() and (tmp_path / "cur" / "index.csv").is_file()
    r = msb("audit", str(planted), "--hamming-k", "65", "--out", str(tmp_path / "b"))
    assert r.returncode == 2 and "--hamming-k must be an integer in 0..64" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "b").exists()
    bad = tmp_path / "bad.csv"
    bad.write_text("sample_id,action,reason\nnope,drop,x\n")
    r = msb("audit", str(planted), "--apply", str(bad), "--curated-out", str(tmp_path / "c"))
    assert r.returncode == 2 and "sample_id 'nope' is not in the dataset" in r.stderr
    assert not (tmp_path / "c").exists()
