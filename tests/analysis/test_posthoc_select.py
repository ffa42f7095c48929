"""``--posthoc nemenyi|conover``: the comparison of >= 3 systems reports the selected Friedman post-hoc test,
equal to scikit-posthocs on the same per-image Dice; a bad name is one line and exit 2."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import scikit_posthocs as sp

from msb.analysis.stats.compare import compare_systems

RNG = np.random.default_rng(5)
IMAGES = [f"i{k}" for k in range(12)]
TPS = {"a": RNG.integers(50, 100, 12), "b": RNG.integers(20, 100, 12), "c": RNG.integers(0, 60, 12)}


def _counts() -> pd.DataFrame:
    rows = []
    for model, tp in TPS.items():
        for img, t in zip(IMAGES, tp):
            rows.append({"dataset": "d", "split": "test", "fold": -1, "run_id": f"d-{model}", "model": model,
                         "checkpoint_role": "best", "image_id": img, "class_id": 1, "class_name": "lesion",
                         "threshold": 0.5, "threshold_on": "probability", "source": "s", "tp": int(t), "fp": 10,
                         "fn": int(100 - t)})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("posthoc,reference", [("nemenyi", sp.posthoc_nemenyi_friedman),
                                               ("conover", sp.posthoc_conover_friedman)])
def test_selected_posthoc_equals_scikit_posthocs(posthoc, reference):
    (comp,) = compare_systems(_counts(), system_by="run", n_boot=0, posthoc=posthoc)
    # per-image Dice by hand: 2TP / (2TP + FP + FN), FN = 100 - TP, FP = 10
    dice = np.column_stack([2 * TPS[m] / (2 * TPS[m] + 10 + (100 - TPS[m])) for m in ("a", "b", "c")])
    ref = np.asarray(reference(dice))
    name = {"nemenyi": "Nemenyi", "conover": "Conover"}[posthoc]
    assert name in comp.friedman
    got = {m.group(1, 2): float(m.group(3)) for m in re.finditer(r"(\w+) vs (\w+): ([0-9.e+-]+)", comp.friedman)}
    assert comp.systems == ("a", "b", "c") and set(got) == {("a", "b"), ("a", "c"), ("b", "c")}
    for (x, y), p in got.items():
        assert p == pytest.approx(ref["abc".index(x), "abc".index(y)], rel=1e-3)  # printed with 4 digits


def test_bad_posthoc_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "msb", "report", str(tmp_path), "--posthoc", "tukey"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "--posthoc must be one of nemenyi, conover, not 'tukey'" in r.stderr.replace("\n", "")
