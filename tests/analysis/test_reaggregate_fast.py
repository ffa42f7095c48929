"""Tests for msb.analysis.counts.reaggregate_fast: the columnar ``msb reaggregate`` gives the pandas path's table and
files on the same count files, hands every unusual case to the pandas path (returns None) and imports no pandas.

Independent references: the hand-computed scores of tests/analysis/test_aggregate.py (TABLE, EXPECTED) and a
plain pandas groupby recomputation of global-micro Dice from the stored files.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from msb.analysis.counts.aggregate import ALL_RULES, DEFAULT_GROUP, POOL_FOLDS_GROUP, reaggregate, scores_wide, write_scores
from msb.analysis.counts.counts_io import read_counts
from msb.analysis.counts.reaggregate_fast import fast_reaggregate
from msb.errors import MSBError
from msb.evaluation.counts import write_counts
from tests.analysis.test_aggregate import EXPECTED, TABLE, make_counts

REPO = Path(__file__).resolve().parents[2]
GROUPINGS = [DEFAULT_GROUP, POOL_FOLDS_GROUP, (*DEFAULT_GROUP, "threshold", "threshold_on"), ()]


def _random_counts(rng, n_images: int, run_id: str, fold: int, classes=(1, 2, 3)) -> pd.DataFrame:
    """Counts rows of random 4x4 images: some empty references and empty predictions (undefined units),
    class 3 only in some images (a class absent from a group's rows is not a unit of it)."""
    table = {}
    for i in range(n_images):
        for c in classes:
            if c >= 3 and i % 3:
                continue
            tp, fp, fn = (int(v) for v in rng.integers(0, 6, 3) * (rng.random(3) > 0.3))
            table[(f"im{i:03d}", c)] = (tp, fp, fn, 16 - tp - fp - fn)
    return make_counts(table, run_id=run_id, fold=fold, model=f"m{fold % 2}")


@pytest.fixture(scope="module")
def frames():
    rng = np.random.default_rng(3)
    # the last run has class 7 instead of 3: class ids with a gap, a class absent from some groups
    return [_random_counts(rng, 12 + k, f"run{k}", fold=k, classes=(1, 2, 3) if k < 2 else (1, 2, 7))
            for k in range(3)]


@pytest.fixture
def files(tmp_path, frames):
    out = []
    for k, df in enumerate(frames):  # two written by the evaluator's writer (string columns), one by pandas (large)
        path = tmp_path / f"r{k}" / "evaluation" / "best" / "counts.parquet"
        if k < 2:
            write_counts(df, path)
        else:
            path.parent.mkdir(parents=True)
            df.to_parquet(path, index=False)
        out.append(path)
    return out


@pytest.mark.parametrize("group", GROUPINGS, ids=["run", "pool", "by-threshold", "all"])
def test_same_table_and_files_as_the_pandas_path(tmp_path, files, group):
    fast = fast_reaggregate(files, group)
    assert fast is not None
    slow = reaggregate(read_counts(files), group_by=group)
    pd.testing.assert_frame_equal(fast.to_frame(), slow, check_exact=True)
    assert fast.wide_csv() == scores_wide(slow).to_csv(index=False)
    write_scores(slow, tmp_path / "slow")
    fast.write(tmp_path / "fast")
    assert (tmp_path / "fast" / "scores.csv").read_text() == (tmp_path / "slow" / "scores.csv").read_text()
    a, b = (pq.read_table(tmp_path / d / "scores.parquet") for d in ("fast", "slow"))
    assert a.schema.remove_metadata() == b.schema.remove_metadata()
    assert a.to_pydict() == b.to_pydict() or pd.read_parquet(tmp_path / "fast" / "scores.parquet").equals(
        pd.read_parquet(tmp_path / "slow" / "scores.parquet"))


def test_global_micro_dice_equals_a_plain_groupby_of_the_stored_files(files):
    fast = fast_reaggregate(files, DEFAULT_GROUP).to_frame()
    raw = pd.concat([pd.read_parquet(f) for f in files])
    s = raw.groupby("run_id")[["tp", "fp", "fn"]].sum()
    ref = 2 * s.tp / (2 * s.tp + s.fp + s.fn)
    got = fast[(fast.aggregation == "global-micro") & (fast.metric == "dice")].set_index("run_id")["value"]
    assert np.abs(got.sort_index().to_numpy() - ref.sort_index().to_numpy()).max() <= 1e-15
    n_img = fast.groupby("run_id")["n_images"].first().sort_index().to_numpy()
    assert n_img.tolist() == raw.groupby("run_id")["image_id"].nunique().sort_index().tolist()


def test_hand_computed_values(tmp_path):
    path = write_counts(make_counts(), tmp_path / "counts.parquet")
    t = fast_reaggregate([path], DEFAULT_GROUP).to_frame()
    assert len(t) == len(EXPECTED) and set(t.aggregation) == set(ALL_RULES)
    for (rule, metric), (value, units, excluded) in EXPECTED.items():
        row = t[(t.aggregation == rule) & (t.metric == metric)].iloc[0]
        assert row.value == pytest.approx(float(value), abs=1e-15)
        assert (row.n_units, row.n_excluded, row.n_images, row.n_classes) == (units, excluded, 3, 2)
    assert len({im for im, _ in TABLE}) == 3


def _rewrite(path: Path, dest: Path, **changes) -> Path:
    t = pq.read_table(path)
    for col, fn in changes.items():
        t = t.set_column(t.schema.get_field_index(col), col, fn(t.column(col)))
    dest.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(t, dest)
    return dest


@pytest.mark.parametrize("case", ["same file twice", "negative count", "bad total", "int32 column",
                                  "mixed thresholds", "bad threshold_on", "null"])
def test_unusual_files_go_to_the_pandas_path(tmp_path, files, case):
    f = files[0]
    d = tmp_path / "bad" / "counts.parquet"
    if case == "same file twice":
        args, group = [f, f], DEFAULT_GROUP
    elif case == "mixed thresholds":
        args, group = [_rewrite(f, d, threshold=lambda c: pa.array(np.linspace(0.1, 0.9, len(c))))], DEFAULT_GROUP
    else:
        change = {"negative count": dict(fp=lambda c: pa.array(np.r_[-1, c.to_numpy()[1:]])),
                  "bad total": dict(tn=lambda c: pa.array(np.r_[c.to_numpy()[0] + 1, c.to_numpy()[1:]])),
                  "int32 column": dict(tp=lambda c: c.cast(pa.int32())),
                  "bad threshold_on": dict(threshold_on=lambda c: pa.array(["prob"] * len(c))),
                  "null": dict(split=lambda c: pa.array([None] + c.to_pylist()[1:], pa.string()))}[case]
        args, group = [_rewrite(f, d, **change)], DEFAULT_GROUP
    assert fast_reaggregate(args, group) is None
    if case == "same file twice":  # the pandas path resolves it: exact duplicates dropped
        assert len(read_counts(args)) == len(read_counts([f]))
    elif case == "int32 column":  # pandas accepts any integer dtype
        assert len(reaggregate(read_counts(args))) == 12
    else:
        with pytest.raises(MSBError):
            reaggregate(read_counts(args), group_by=group)


def test_digest_mismatch_is_refused_with_the_usual_message(tmp_path, files):
    folder = files[0].parent
    from msb.utils.evaluation_folder import seal_folder

    seal_folder(folder, "msb evaluate x")
    data = bytearray(files[0].read_bytes())
    data[len(data) // 2] ^= 1
    files[0].write_bytes(bytes(data))
    with pytest.raises(MSBError) as fast_err:
        fast_reaggregate([files[0]], DEFAULT_GROUP)
    with pytest.raises(MSBError) as slow_err:
        read_counts([files[0]])
    assert str(fast_err.value) == str(slow_err.value)


def test_cli_reaggregate_imports_no_pandas(tmp_path, files):
    code = ("import sys; sys.argv = ['msb', 'reaggregate', *sys.argv[1:]]; from msb.cli import main\n"
            "try:\n    main()\nfinally:\n    print('PANDAS', 'pandas' in sys.modules, file=sys.stderr)")
    p = subprocess.run([sys.executable, "-c", code, *map(str, files), "--out", str(tmp_path / "o"), "--format", "csv"],
                       env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "PANDAS False" in p.stderr
    slow = scores_wide(reaggregate(read_counts(files)))
    assert p.stdout.startswith(slow.to_csv(index=False) + "written: ")  # the same CSV, then the log line
    assert (tmp_path / "o" / "scores.parquet").is_file()


def test_codes_and_combined_keys_on_wide_ranges():
    """Integer codes by value (small range, wide range, constant) and a combined key that would overflow int64
    (it is compressed first) tell rows apart exactly as the tuples of their values do."""
    from msb.analysis.counts import reaggregate_fast as rf

    vals = {"a": [5, 10**12, 5, -3], "b": [7, 7, 7, 7], "c": [2, 3, 2, 3]}
    t = pa.table({k: pa.array(v, pa.int64()) for k, v in vals.items()})
    for c, v in vals.items():
        codes, values = rf._codes(t, c)
        assert [values[k] for k in codes] == v
    parts = [(np.array([0, 1, 0, 1]), 2**40), (np.array([3, 3, 3, 2]), 2**40), (np.array([1, 1, 1, 1]), 7)]
    key, card = rf._combine(parts, 4)
    assert key.max() < card and len(set(key.tolist())) == 3 and key[0] == key[2] != key[1]
    assert rf._has_repeats(key, card) and not rf._has_repeats(np.array([4, 2**50, 9]), 2**51)


@pytest.mark.parametrize("fmt", ["csv", "json", "markdown", "table"])
def test_cli_output_equals_the_pandas_path_in_every_format(files, fmt, monkeypatch):
    from typer.testing import CliRunner

    import msb.analysis.counts.reaggregate_fast as rf
    from msb.cli.app import app

    args = ["reaggregate", *map(str, files), "--format", fmt]
    fast = CliRunner().invoke(app, args)
    monkeypatch.setattr(rf, "fast_reaggregate", lambda *a, **k: None)  # the pandas path
    slow = CliRunner().invoke(app, args)
    assert fast.exit_code == slow.exit_code == 0
    assert fast.output == slow.output and "global-micro" in fast.output


@pytest.mark.parametrize("case", ["fine", "bad total in the last row", "null in a checked-only column"])
def test_checks_read_a_batch_at_a_time_still_see_every_row(tmp_path, files, monkeypatch, case):
    """With 3-row batches (msb.analysis.counts.counts_arrow.BATCH_ROWS) the check-only columns are read in many
    batches: the scores stay the pandas path's, and a bad row in the last batch still goes to the pandas path
    (which raises)."""
    import msb.analysis.counts.counts_arrow as ca

    monkeypatch.setattr(ca, "BATCH_ROWS", 3)
    f = files[0]
    d = tmp_path / "batched" / "counts.parquet"
    last = {"bad total in the last row": dict(tn=lambda c: pa.array(c.to_numpy()[:-1].tolist() + [c.to_numpy()[-1] + 1])),
            "null in a checked-only column": dict(source=lambda c: pa.array(c.to_pylist()[:-1] + [None], pa.string())),
            "fine": {}}[case]
    path = _rewrite(f, d, **last) if last else f
    assert pq.ParquetFile(path).metadata.num_rows > 3 * 5
    got = fast_reaggregate([path], DEFAULT_GROUP)
    if case == "fine":
        want = reaggregate(read_counts([path]), group_by=DEFAULT_GROUP)
        pd.testing.assert_frame_equal(got.to_frame(), want.reset_index(drop=True), check_exact=False, rtol=0, atol=1e-15)
    else:
        assert got is None
        with pytest.raises(MSBError) as err:
            reaggregate(read_counts([path]), group_by=DEFAULT_GROUP)
        assert str(path) in str(err.value)  # the one-line error names the file
        if case == "null in a checked-only column":
            assert "'source' has missing values" in str(err.value)


def test_large_strings_equal_arrow_cast_on_sliced_arrays():
    """msb.analysis.counts.counts_arrow.large_strings (offsets widened by hand) equals Arrow's cast, also for a
    slice (non-zero offset) and with nulls (which it hands to cast)."""
    from msb.analysis.counts.counts_arrow import large_strings as _large_strings

    arr = pa.array(["", "a", "bcd", "é€", "x" * 40, "yz"])
    for a in (arr, arr.slice(2), arr.slice(1, 3), pa.array(["a", None, "b"])):
        got = _large_strings(a)
        assert got.type == pa.large_string()
        assert got.equals(a.cast(pa.large_string())) and got.to_pylist() == a.to_pylist()
