"""Planted duplicates across splits (see conftest.py): the census must count each one exactly, with denominators.

Expected numbers are derived by hand from the planted table (12 rows: 6 train, 2 val, 4 test):

* identical bytes: {a, copy_a} (train|test, crosses), {d, d_dup} (train only);
* near-duplicates (pHash/dHash <= 8, NCC >= 0.95): the two above plus {b, b_small} (train|val, same file stem
  ``b``) and {c, c_shift} (train|test);
* shared group: {e, f} (patient7, train|val), {g, h} (patient9, test only) and c alone (patient3);
* same file name: {b.png, b.jpg} (stem ``b``, train|val).
"""

from __future__ import annotations

from itertools import combinations
from pathlib import Path

import imagehash
import numpy as np
import pandas as pd
from PIL import Image


def q(census: pd.DataFrame, relation: str, quantity: str, scope: str = "all") -> tuple[int, int, str, str]:
    r = census[(census.relation == relation) & (census.quantity == quantity) & (census.scope == scope)]
    assert len(r) == 1, (relation, quantity, scope)
    r = r.iloc[0]
    return int(r["count"]), int(r["denominator"]), r["unit"], r["denominator_unit"]


def test_preconditions_with_imagehash(planted: Path) -> None:
    """Unrelated images are far apart, planted copies close (computed with imagehash directly)."""
    idx = pd.read_csv(planted / "index.csv", dtype=str, keep_default_na=False)
    ph = {s: imagehash.phash(Image.open(planted / p)) for s, p in zip(idx.sample_id, idx.image_path)}
    dh = {s: imagehash.dhash(Image.open(planted / p)) for s, p in zip(idx.sample_id, idx.image_path)}
    planted_pairs = {frozenset(p) for p in [("a", "copy_a"), ("d", "d_dup"), ("b", "b_small"), ("c", "c_shift")]}
    for x, y in combinations(ph, 2):
        dp, dd = ph[x] - ph[y], dh[x] - dh[y]
        if frozenset((x, y)) in planted_pairs:
            assert dp <= 8 and dd <= 8, (x, y, dp, dd)
        else:
            assert dp > 8 and dd > 8, (x, y, dp, dd)
    # identical pHash only for the byte copies
    same = {frozenset((x, y)) for x, y in combinations(ph, 2) if str(ph[x]) == str(ph[y])}
    assert same == {frozenset(("a", "copy_a")), frozenset(("d", "d_dup"))}


def test_identical_bytes_census(planted_result) -> None:
    c = planted_result.census
    rel = "identical_bytes"
    assert q(c, rel, "groups_with_2plus_rows") == (2, 10, "groups", "groups (singletons included)")
    assert q(c, rel, "crossing_groups") == (1, 2, "groups", "groups with >= 2 rows")
    assert q(c, rel, "crossing_groups", "train|test")[:2] == (1, 2)
    assert q(c, rel, "crossing_groups", "train|val")[:2] == (0, 2)
    assert q(c, rel, "crossing_groups", "val|test")[:2] == (0, 2)
    assert q(c, rel, "rows_in_groups_with_2plus_rows") == (4, 12, "rows", "rows")
    assert q(c, rel, "crossing_rows") == (2, 12, "rows", "rows with a side")
    assert q(c, rel, "crossing_rows", "train") == (1, 6, "rows", "rows on train")
    assert q(c, rel, "crossing_rows", "val") == (0, 2, "rows", "rows on val")
    assert q(c, rel, "crossing_rows", "test") == (1, 4, "rows", "rows on test")
    assert q(c, rel, "crossing_pairs")[:3] == (1, 2, "row pairs")
    # copy_of_a.png vs a.png: a filename check misses both rows
    assert q(c, rel, "crossing_rows_missed_by_filename") == (2, 2, "rows", "crossing rows")
    # identical pHash: the same two clusters (precondition test)
    for quantity in ("groups_with_2plus_rows", "crossing_groups", "crossing_rows", "crossing_rows_missed_by_filename"):
        assert q(c, "identical_phash", quantity) == q(c, rel, quantity)


def test_near_duplicate_census(planted_result) -> None:
    c = planted_result.census
    rel = "near_duplicate"
    assert q(c, rel, "groups_with_2plus_rows")[:2] == (4, 8)
    assert q(c, rel, "crossing_groups")[:2] == (3, 4)
    assert q(c, rel, "crossing_groups", "train|test")[:2] == (2, 4)
    assert q(c, rel, "crossing_groups", "train|val")[:2] == (1, 4)
    assert q(c, rel, "crossing_groups", "val|test")[:2] == (0, 4)
    assert q(c, rel, "rows_in_groups_with_2plus_rows")[:2] == (8, 12)
    assert q(c, rel, "crossing_rows")[:2] == (6, 12)
    assert q(c, rel, "crossing_rows", "train")[:2] == (3, 6)
    assert q(c, rel, "crossing_rows", "val")[:2] == (1, 2)
    assert q(c, rel, "crossing_rows", "test")[:2] == (2, 4)
    assert q(c, rel, "crossing_pairs")[:2] == (3, 4)
    # b.png / b.jpg share a stem (caught); a/copy_of_a and c/shifted_c are missed
    assert q(c, rel, "crossing_rows_missed_by_filename")[:2] == (4, 6)


def test_shared_group_and_filename_census(planted_result) -> None:
    c = planted_result.census
    assert q(c, "shared_group", "groups_with_2plus_rows")[:2] == (2, 10)
    assert q(c, "shared_group", "crossing_groups")[:2] == (1, 2)
    assert q(c, "shared_group", "crossing_rows")[:2] == (2, 12)
    assert q(c, "shared_group", "crossing_rows_missed_by_filename")[:2] == (2, 2)
    assert q(c, "same_file_name", "groups_with_2plus_rows")[:2] == (1, 11)
    assert q(c, "same_file_name", "crossing_rows")[:2] == (2, 12)
    assert q(c, "same_file_name", "crossing_rows_missed_by_filename")[:2] == (0, 2)


def test_pairs_table_values(planted_result, planted: Path) -> None:
    p = planted_result.pairs
    got = {frozenset((a, b)) for a, b in zip(p.sample_id_a, p.sample_id_b)}
    assert got == {frozenset(x) for x in [("a", "copy_a"), ("d", "d_dup"), ("b", "b_small"), ("c", "c_shift")]}
    assert p["confirmed"].all()
    idx = pd.read_csv(planted / "index.csv", dtype=str, keep_default_na=False).set_index("sample_id")
    for r in p.itertuples():
        ha = imagehash.phash(Image.open(planted / idx.loc[r.sample_id_a, "image_path"]))
        hb = imagehash.phash(Image.open(planted / idx.loc[r.sample_id_b, "image_path"]))
        assert r.phash_distance == ha - hb
        da = imagehash.dhash(Image.open(planted / idx.loc[r.sample_id_a, "image_path"]))
        db = imagehash.dhash(Image.open(planted / idx.loc[r.sample_id_b, "image_path"]))
        assert r.dhash_distance == da - db
        assert r.same_bytes == ({r.sample_id_a, r.sample_id_b} in ({"a", "copy_a"}, {"d", "d_dup"}))
        assert r.crosses == ({r.sample_id_a, r.sample_id_b} != {"d", "d_dup"})
    same = p[p.same_bytes]
    assert np.allclose(same["ncc"], 1.0) and np.allclose(same["ssim"], 1.0)
    rows = planted_result.rows.set_index("sample_id")
    assert rows.loc["a", "phash"] == str(imagehash.phash(Image.open(planted / "images/train/a.png")))
    assert rows.loc["a", "dhash"] == str(imagehash.dhash(Image.open(planted / "images/train/a.png")))


def test_split_file_changes_the_boundary(planted: Path, tmp_path: Path, helpers) -> None:
    """A split file putting everything but copy_a in train: only the a/copy_a pair crosses (train|test)."""
    from msb.audit.core import run_audit

    ids = [r[0] for r in helpers.rows]
    f = tmp_path / "split.csv"
    f.write_text("sample_id,split\n" + "".join(f"{s},{'test' if s == 'copy_a' else 'train'}\n" for s in ids[:-1]))
    res = run_audit(planted, split_file=f)
    c = res.census
    assert q(c, "near_duplicate", "crossing_groups")[:2] == (1, 4)
    assert q(c, "near_duplicate", "crossing_rows")[:2] == (2, 11)  # h is not in the file: no side
    assert res.params["n_unassigned_rows"] == 1


def test_against_other_dataset(planted: Path, tmp_path: Path, helpers) -> None:
    """Dataset B holds a byte copy of a, a 1-px shifted copy of g and one unrelated image."""
    import shutil

    import cv2

    from msb.audit.core import run_audit
    from msb.data.schema import ClassSpec, write_prepared_dataset

    other = tmp_path / "other"
    (other / "images").mkdir(parents=True)
    shutil.copyfile(planted / "images/train/a.png", other / "images" / "x1.png")
    g = cv2.imread(str(planted / "images/test/g.png"))[:, :, ::-1]
    helpers.write_rgb(other / "images" / "x2.png", np.concatenate([g[:1], g[:-1]], axis=0))
    helpers.write_rgb(other / "images" / "x3.png", helpers.smooth_image(99))
    (other / "masks").mkdir()
    rows = []
    for s in ("x1", "x2", "x3"):
        cv2.imwrite(str(other / "masks" / f"{s}.png"), np.zeros((96, 128), np.uint8))
        rows.append({"sample_id": s, "image_path": f"images/{s}.png", "mask_path": f"masks/{s}.png", "split": "test",
                     "group": "", "height": 96, "width": 128, "source": "other"})
    write_prepared_dataset(other, pd.DataFrame(rows), [ClassSpec(0, "background", (0,)), ClassSpec(1, "fg", (255,))])
    res = run_audit(planted, against=other)
    assert res.boundary == "dataset"
    c = res.census
    assert "shared_group" not in set(c.relation)
    # bytes: {a, copy_a, x1} crosses ds|other; {d, d_dup} does not
    assert q(c, "identical_bytes", "groups_with_2plus_rows")[:2] == (2, 12)
    assert q(c, "identical_bytes", "crossing_groups")[:2] == (1, 2)
    assert q(c, "identical_bytes", "crossing_rows")[:2] == (3, 15)
    assert q(c, "identical_bytes", "crossing_rows", "other")[:2] == (1, 3)
    # near-duplicates add {g, x2} (crossing) and the within-ds b and c pairs
    assert q(c, "near_duplicate", "crossing_groups")[:2] == (2, 5)
    assert q(c, "near_duplicate", "crossing_rows", "other")[:2] == (2, 3)
    assert q(c, "near_duplicate", "crossing_rows", "ds")[:2] == (3, 12)
    assert set(res.rows["key"]) >= {"ds:a", "other:x1"}
