"""Protocol refusal, P2 seed flips (hand-built counts), skips with reasons, and reachability from ``msb report`` and
``msb reaggregate --analyses``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
from _protocol_study import build_study  # noqa: E402

from msb.analysis.protocol import parse_analyses, write_protocol_analyses  # noqa: E402
from msb.analysis.protocol.inputs import annotate_counts, protocol_family, split_seed  # noqa: E402
from msb.analysis.protocol.polyp import p2_seeds, p2_table  # noqa: E402
from msb.analysis.protocol.ranking_gic import ranking_sensitivity_gic  # noqa: E402
from msb.errors import MSBError  # noqa: E402


def _rows(arch: str, dice_tp: list[int], policy: str, seed: int = 0, size: int = 128) -> pd.DataFrame:
    """One run's counts: image k has tp = dice_tp[k], fp = fn = 10 - tp/2 (Dice = tp / (tp + 10 - tp/2))."""
    recs = []
    for k, tp in enumerate(dice_tp):
        fp = fn = 10 - tp // 2
        recs.append({"dataset": "kv", "split": "test", "fold": -1, "run_id": f"kv-{arch}-{seed:08x}", "model": arch,
                     "checkpoint_role": "best", "image_id": f"i{k}", "class_id": 1, "class_name": "polyp",
                     "threshold": 0.5, "threshold_on": "probability", "source": "s", "tp": tp, "fp": fp, "fn": fn,
                     "input_size": size, "split_policy": policy, "seed": seed})
    return annotate_counts(pd.DataFrame(recs))


def test_ranking_refuses_mixed_split_policies_unless_asked():
    df = pd.concat([_rows("unet", [10, 12, 14], "fixed"), _rows("segf", [11, 9, 16], "random(seed=1)")],
                   ignore_index=True)
    with pytest.raises(MSBError) as e:
        ranking_sensitivity_gic(df)
    msg = str(e.value)
    assert "['fixed', 'random(seed=1)']" in msg and "allow_mixed_protocols" in msg and "\n" not in msg
    tidy = ranking_sensitivity_gic(df, allow_mixed_protocols=True)
    assert set(tidy["pair"]) == {"G vs. I", "G vs. C", "I vs. C"} and (tidy["n_systems"] == 2).all()


def test_policy_helpers():
    assert protocol_family("random(seed=3)") == "random" and split_seed("random(seed=3)") == 3
    assert protocol_family("kfold(k=5,seed=0)") == "kfold(k=5)" and split_seed("fixed") is None
    with pytest.raises(MSBError, match="unknown protocol analysis"):
        parse_analyses("p1,nope")


def test_p2_mean_sd_and_adjacent_flip_between_seeds():
    # seed 0 and 2: unet > segf; seed 1: segf > unet (per-image mean Dice)
    per = {0: ([16, 16], [12, 12]), 1: ([12, 12], [14, 14]), 2: ([18, 18], [12, 12])}
    frames = []
    for s, (u, g) in per.items():
        frames += [_rows("unet", u, f"random(seed={s})", seed=s), _rows("segf", g, f"random(seed={s})", seed=s)]
    df = pd.concat(frames, ignore_index=True)
    table = p2_table(p2_seeds(df, None)).values.set_index("Model")

    def d(tp):
        return tp / (tp + 10 - tp // 2)
    unet = np.array([d(per[s][0][0]) for s in per])
    segf = np.array([d(per[s][1][0]) for s in per])
    first = "unet (128)" if unet.mean() > segf.mean() else "segf (128)"
    assert table.index[0] == first
    assert table.loc["unet (128)", "mDice"] == pytest.approx(unet.mean())
    assert table.loc["unet (128)", "mDice SD"] == pytest.approx(unet.std(ddof=1))
    assert table.loc[first, "Flips with next"] == "yes (seed 1)" and int(table.loc[first, "Seeds"]) == 3


@pytest.fixture(scope="module")
def small_study(tmp_path_factory) -> Path:
    return build_study(tmp_path_factory.mktemp("proto_small"), archs=("unet", "segf"), sizes=(128,), external=False,
                       metrics=False, profile=False, n_test=14)


def test_missing_inputs_are_skipped_with_a_reason(small_study, tmp_path):
    out = tmp_path / "out"
    written = write_protocol_analyses(small_study, ["resolution_delta", "efficiency", "external_transfer", "p1",
                                                    "checklist"], out)
    skipped = json.loads((out / "skipped.json").read_text())["skipped"]
    assert set(skipped) == {"resolution_delta", "efficiency", "external_transfer"}
    assert "two input sizes" in skipped["resolution_delta"] and "msb profile" in skipped["efficiency"]
    assert "final.external" in skipped["external_transfer"]
    chk = pd.read_csv(out / "tables" / "checklist.csv")
    assert list(chk["Status"]) == ["FAIL", "PASS", "PASS", "FAIL", "PASS"]
    assert written[-1] == out / "skipped.json" and all(p.is_file() for p in written)


def test_report_section_and_reaggregate_analyses(small_study, tmp_path):
    from msb.analysis.report.report import build_report
    from msb.cli.app import app

    res = build_report(small_study, tmp_path / "rep", n_boot=0, protocol={"analyses": ["ranking_sensitivity", "p1"]})
    html = res.html.read_text(encoding="utf-8")
    assert '<section id="protocol">' in html and 'id="protocol-ranking_sensitivity"' in html
    assert (res.out_dir / "tables" / "p1.tex").is_file()
    r = CliRunner().invoke(app, ["reaggregate", str(small_study), "--analyses", "ranking_sensitivity",
                                 "--out", str(tmp_path / "cli")])
    assert r.exit_code == 0, r.output
    assert "G vs. I ρ" in r.output and (tmp_path / "cli" / "tables" / "ranking_sensitivity.csv").is_file()
