"""Populations: parsing every spec kind, user errors, and scores of subset / complement / all by hand.

Counts (one class, one run): images a, b from source "cvc", c, d from source "kvasir".
    a TP 8 FP 2 FN 0 (Dice 16/18 = 8/9); b TP 0 FP 0 FN 4 (Dice 0);
    c TP 5 FP 0 FN 5 (Dice 10/15 = 2/3); d TP 9 FP 1 FN 0 (Dice 18/19).
global-micro Dice: all TP 22 FP 3 FN 9 -> 44/56 = 11/14; cvc TP 8 FP 2 FN 4 -> 16/22 = 8/11;
    kvasir TP 14 FP 1 FN 5 -> 28/34 = 14/17.
image-macro Dice: all (8/9 + 0 + 2/3 + 18/19)/4; cvc (8/9 + 0)/2 = 4/9; kvasir (2/3 + 18/19)/2 = 46/57.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from msb.analysis.stats.populations import compare_populations, parse_population
from msb.errors import MSBError

ROWS = {"a": ("cvc", 8, 2, 0), "b": ("cvc", 0, 0, 4), "c": ("kvasir", 5, 0, 5), "d": ("kvasir", 9, 1, 0)}


def counts() -> pd.DataFrame:
    return pd.DataFrame([{"dataset": "polyps", "split": "test", "fold": -1, "run_id": "r1", "model": "unet",
                          "checkpoint_role": "best", "image_id": i, "class_id": 1, "class_name": "polyp",
                          "threshold": 0.5, "threshold_on": "probability", "source": src, "tp": tp, "fp": fp,
                          "fn": fn} for i, (src, tp, fp, fn) in ROWS.items()])


def test_source_population_scores_by_hand():
    comp = compare_populations(counts(), [parse_population("source:cvc")], ["model"],
                               ("global-micro", "image-macro"), ("dice",)).set_index("aggregation")
    gm, im = comp.loc["global-micro"], comp.loc["image-macro"]
    assert gm["value_all"] == pytest.approx(11 / 14) and gm["value_subset"] == pytest.approx(8 / 11)
    assert gm["value_complement"] == pytest.approx(14 / 17)
    assert gm["delta"] == pytest.approx(8 / 11 - 11 / 14)
    assert im["value_all"] == pytest.approx((8 / 9 + 0 + 2 / 3 + 18 / 19) / 4)
    assert im["value_subset"] == pytest.approx(4 / 9) and im["value_complement"] == pytest.approx(46 / 57)
    assert (gm["n_images_all"], gm["n_images_subset"], gm["n_images_complement"]) == (4, 2, 2)
    assert gm["population"] == "source:cvc"


def test_ids_and_flag_files(tmp_path: Path):
    (tmp_path / "ids.txt").write_text("# hard cases\na\n\nc  # comment\n")
    pop = parse_population(f"hard=ids:{tmp_path / 'ids.txt'}")
    assert pop.name == "hard" and pop.values == {"a", "c"}
    assert pop.mask(counts()).tolist() == [True, False, True, False]
    pd.DataFrame({"sample_id": ["b", "d"]}).to_csv(tmp_path / "ids.csv", index=False)
    assert parse_population(f"ids:{tmp_path / 'ids.csv'}").values == {"b", "d"}
    # audit flag file: default column near_duplicate_in_train, values in several spellings
    pd.DataFrame({"sample_id": ["a", "b", "c", "d"], "near_duplicate_in_train": ["True", "0", "yes", "false"],
                  "other": 1}).to_csv(tmp_path / "audit.csv", index=False)
    flag = parse_population(f"dups=flag:{tmp_path / 'audit.csv'}")
    assert flag.values == {"a", "c"} and flag.kind == "flag" and "near_duplicate_in_train" in flag.origin
    # explicit column, Parquet with a bool column and a dataset column
    pd.DataFrame({"dataset": ["polyps", "other"], "image_id": ["d", "a"], "leak": [True, True]}).to_parquet(
        tmp_path / "audit.parquet")
    flag = parse_population(f"flag:{tmp_path / 'audit.parquet'}:leak")
    assert flag.mask(counts()).tolist() == [False, False, False, True]  # 'a' is flagged in another dataset only
    comp = compare_populations(counts(), [flag], ["model"], ("global-micro",), ("dice",))
    assert comp["value_subset"].iloc[0] == pytest.approx(18 / 19)


def test_population_errors(tmp_path: Path):
    with pytest.raises(MSBError, match="unknown kind 'sources'"):
        parse_population("sources:cvc")
    with pytest.raises(MSBError, match="expected source:A,B"):
        parse_population("source:")
    with pytest.raises(MSBError, match=r"nope\.txt: id list file not found"):
        parse_population(f"ids:{tmp_path / 'nope.txt'}")
    (tmp_path / "empty.txt").write_text("# nothing\n")
    with pytest.raises(MSBError, match="the id list is empty"):
        parse_population(f"ids:{tmp_path / 'empty.txt'}")
    pd.DataFrame({"name": ["a"], "flag": [1]}).to_csv(tmp_path / "noid.csv", index=False)
    with pytest.raises(MSBError, match=r"noid\.csv: no 'sample_id' \(or 'image_id'\) column"):
        parse_population(f"flag:{tmp_path / 'noid.csv'}")
    pd.DataFrame({"sample_id": ["a", "b"], "dup": ["true", "maybe"]}).to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(MSBError, match=r"bad\.csv: column 'dup' row 3 has value 'maybe'"):
        parse_population(f"flag:{tmp_path / 'bad.csv'}")
    pd.DataFrame({"sample_id": ["a"], "x": [1], "y": [0]}).to_csv(tmp_path / "two.csv", index=False)
    with pytest.raises(MSBError, match=r"name the flag column .*\['x', 'y'\]"):
        parse_population(f"flag:{tmp_path / 'two.csv'}")
    with pytest.raises(MSBError, match="no flag column 'z'"):
        parse_population(f"flag:{tmp_path / 'two.csv'}:z")
    with pytest.raises(MSBError, match=r"population 'source:etis' \(source:etis\) matches no count row"):
        compare_populations(counts(), [parse_population("source:etis")])
