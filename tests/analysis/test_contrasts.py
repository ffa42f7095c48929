"""Training-pool contrasts (msb.analysis.stats.contrasts) from hand-built counts: one contrast value, its paired-t
interval (scipy.stats.t), its bootstrap interval (a plain NumPy loop over the documented draws), the sign flag,
the population ranks (scipy.stats.spearmanr) and the written files.

Counts: pools a and b, seeds 0..2, 6 test images (x0..x2 from source "p", y0..y2 from source "q"), one class.
Per image Dice = 2 TP / (2 TP + FP + FN), computed here with NumPy from the same TP/FP/FN.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from msb.analysis.stats.contrasts import (CONTRAST_COLUMNS, INTERVAL_BOOT, INTERVAL_T, contrast_table, pool_runs,
                                    population_ranks, write_contrasts)
from msb.errors import MSBError

IMAGES = ["x0", "x1", "x2", "y0", "y1", "y2"]
SOURCE = ["p", "p", "p", "q", "q", "q"]
RNG = np.random.default_rng(42)
# (pool, seed) -> (6, 3) TP/FP/FN; pool a is better on p and worse on q (a sign reversal between populations)
TABLES = {}
for seed in range(3):
    base = RNG.integers(5, 30, size=(6, 3))
    TABLES[("b", seed)] = base
    a = base.copy()
    a[:3, 0] += 10 + seed  # more TP on p
    a[3:, 1] += 15 + 2 * seed  # more FP on q
    TABLES[("a", seed)] = a
TABLES[("c", 0)] = TABLES[("b", 0)] // 2 + 1
TABLES[("c", 1)] = TABLES[("b", 1)] // 2 + 1


def counts_frame(pool: str, seed: int) -> pd.DataFrame:
    t = TABLES[(pool, seed)]
    return pd.DataFrame([{"dataset": "d", "split": "test", "fold": -1, "run_id": f"{pool}{seed}", "model": "unet",
                          "checkpoint_role": "best", "image_id": i, "class_id": 1, "class_name": "polyp",
                          "threshold": 0.5, "threshold_on": "probability", "source": s, "tp": int(r[0]),
                          "fp": int(r[1]), "fn": int(r[2])} for i, s, r in zip(IMAGES, SOURCE, t)])


COUNTS = {k: counts_frame(*k) for k in TABLES}
POPS = {"all": "all", "q_only": "source:q"}


def dice(t: np.ndarray) -> np.ndarray:
    return 2 * t[:, 0] / (2 * t[:, 0] + t[:, 1] + t[:, 2])


def test_one_contrast_and_its_paired_t_interval_by_hand():
    table = contrast_table(COUNTS, [("a", "b")], POPS, n_boot=300, boot_seed=5)
    assert list(table.columns) == CONTRAST_COLUMNS and len(table) == 4
    row = table[(table["population"] == "all") & (table["interval"] == INTERVAL_T)].iloc[0]
    d = np.array([dice(TABLES[("a", s)]).mean() - dice(TABLES[("b", s)]).mean() for s in range(3)])
    half = stats.t.ppf(0.975, 2) * d.std(ddof=1) / np.sqrt(3)
    assert row["mean_diff"] == pytest.approx(d.mean(), abs=1e-12)
    assert row["ci_low"] == pytest.approx(d.mean() - half, abs=1e-12)
    assert row["ci_high"] == pytest.approx(d.mean() + half, abs=1e-12)
    assert (row["n_seeds"], row["n_rows"], row["n_sources"]) == (3, 6, 2)
    q = table[(table["population"] == "q_only") & (table["interval"] == INTERVAL_T)].iloc[0]
    dq = np.array([dice(TABLES[("a", s)])[3:].mean() - dice(TABLES[("b", s)])[3:].mean() for s in range(3)])
    assert q["mean_diff"] == pytest.approx(dq.mean(), abs=1e-12)
    assert (q["n_rows"], q["n_sources"]) == (3, 1)


def test_bootstrap_interval_recomputed_with_a_numpy_loop():
    n_boot = 200  # below the bootstrap's block size: one Generator.integers call draws all replicates
    table = contrast_table(COUNTS, [("a", "b")], {"all": "all"}, n_boot=n_boot, boot_seed=7)
    row = table[table["interval"] == INTERVAL_BOOT].iloc[0]
    draws = np.random.default_rng(7).integers(0, 6, size=(n_boot, 6), dtype=np.int32)
    reps = []
    for idx in draws:
        reps.append(np.mean([dice(TABLES[("a", s)])[idx].mean() - dice(TABLES[("b", s)])[idx].mean()
                             for s in range(3)]))
    lo, hi = np.percentile(reps, [2.5, 97.5])
    assert row["ci_low"] == pytest.approx(lo, abs=1e-12) and row["ci_high"] == pytest.approx(hi, abs=1e-12)
    assert row["mean_diff"] == table[table["interval"] == INTERVAL_T]["mean_diff"].iloc[0]


def test_sign_differs_flags_a_reversal_between_populations():
    table = contrast_table(COUNTS, [("a", "b")], {"all": "all", "p": "source:p", "q": "source:q"}, n_boot=50)
    signs = table.drop_duplicates("population").set_index("population")["mean_diff"]
    assert signs["p"] > 0 > signs["q"]
    assert table["sign_differs"].all()
    same = contrast_table(COUNTS, [("a", "b")], {"p": "source:p", "all": "all"}, n_boot=10)
    assert not same["sign_differs"].any()


def test_refusals():
    with pytest.raises(MSBError, match="no run of pool 'zz'"):
        contrast_table(COUNTS, [("a", "zz")], POPS)
    one_seed = {k: v for k, v in COUNTS.items() if k[1] == 0}
    with pytest.raises(MSBError, match="1 seed"):
        contrast_table(one_seed, [("a", "b")], POPS)
    shifted = dict(COUNTS)
    shifted[("b", 1)] = COUNTS[("b", 1)].assign(image_id=lambda d: d["image_id"] + "_other")
    with pytest.raises(MSBError, match="different images"):
        contrast_table(shifted, [("a", "b")], {"all": "all"}, n_boot=10)


def test_population_ranks_and_spearman():
    ranks, rho = population_ranks(COUNTS, {"all": "all", "q": "source:q"})
    means = {(p, pop): np.mean([dice(TABLES[(p, s)])[sl].mean() for s in range(3) if (p, s) in TABLES])
             for p in "abc" for pop, sl in (("all", slice(None)), ("q", slice(3, None)))}
    got = ranks.set_index(["pool", "population"])
    for key, v in means.items():
        assert got.loc[key, "score"] == pytest.approx(v, abs=1e-12)
    for pop in ("all", "q"):
        order = sorted("abc", key=lambda p: -means[(p, pop)])
        assert [int(got.loc[(p, pop), "rank"]) for p in order] == [1, 2, 3]
    want = stats.spearmanr([means[(p, "all")] for p in "abc"], [means[(p, "q")] for p in "abc"]).statistic
    assert rho["spearman_rho"].iloc[0] == pytest.approx(want) and rho["n_pools"].iloc[0] == 3


def test_files_and_run_discovery(tmp_path):
    table = contrast_table(COUNTS, [("a", "b")], POPS, n_boot=20)
    ranks, rho = population_ranks(COUNTS, POPS)
    paths = write_contrasts(table, ranks, rho, tmp_path / "out")
    assert sorted(p.name for p in paths) == ["contrasts.csv", "contrasts.md", "contrasts.tex",
                                            "population_ranks.csv", "population_ranks.md", "population_rho.csv"]
    back = pd.read_csv(tmp_path / "out" / "contrasts.csv")
    assert back["mean_diff"].to_numpy() == pytest.approx(table["mean_diff"].to_numpy())
    assert "not sampling of patients" in (tmp_path / "out" / "contrasts.md").read_text()
    assert "\\begin{tabular}" in (tmp_path / "out" / "contrasts.tex").read_text()
    with pytest.raises(MSBError, match="no run folder with data.pool"):
        pool_runs(tmp_path)


def test_report_section_reads_the_written_files(tmp_path):
    from msb.analysis.report.report_contrasts import write_contrasts_section
    from msb.analysis.report.report_doc import ReportDoc

    doc = ReportDoc(tmp_path / "report")
    assert not write_contrasts_section(doc, tmp_path / "study")  # no contrasts/: no section
    table = contrast_table(COUNTS, [("a", "b")], POPS, n_boot=20)
    ranks, rho = population_ranks(COUNTS, POPS)
    write_contrasts(table, ranks, rho, tmp_path / "study" / "contrasts")
    assert write_contrasts_section(doc, tmp_path / "study")
    md = doc.markdown()
    assert "Training-pool contrasts" in md and "paired-t over seeds" in md and "not sampling of patients" in md
    shown = pd.read_csv(tmp_path / "report" / "data" / "pool_contrasts.csv")
    assert shown["mean_diff"].to_numpy() == pytest.approx(table["mean_diff"].to_numpy())
    assert (tmp_path / "report" / "data" / "pool_rho.csv").is_file()
