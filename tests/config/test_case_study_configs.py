"""The shipped case-study study files (configs/protocols/msb_case_study*.yaml) generate their units: one per
dataset x architecture x input size, G-CASCADE's graph size following the size axis, every external set with a
dataset config, every analysis name known."""

from __future__ import annotations

from pathlib import Path

import pytest

from msb.analysis.protocol import parse_analyses
from msb.config.generate import generate_runs, load_study

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name, n_units, sizes", [("msb_case_study", 2 * 9 * 2, [256, 512]),
                                                  ("msb_case_study_cpu", 3 * 2, [128, 192]),
                                                  ("msb_case_study_ci", 2 * 2, [32, 64])])
def test_case_study_files_generate(name: str, n_units: int, sizes: list[int]):
    path = REPO / "configs" / "protocols" / f"{name}.yaml"
    excluded: list = []
    runs = generate_runs(path, excluded)
    assert len(runs) == n_units and excluded == []
    assert sorted({r.config.data.input_size[0] for r in runs}) == sizes
    for r in runs:
        assert r.config.axes == {"data.input_size": list(r.config.data.input_size)}
        if r.config.model.arch == "g_cascade":
            assert list(r.config.model.params["img_size"]) == list(r.config.data.input_size)
    spec, root = load_study(path)
    assert spec.cross_validation is not None and spec.final is not None and spec.final.ensemble
    for e in spec.final.external:
        assert (root / "datasets" / f"{e.dataset}.yaml").is_file(), e.dataset
    assert spec.analyses is not None
    names = parse_analyses(spec.analyses.names)
    assert {"ranking_sensitivity", "resolution_delta", "efficiency", "external_transfer"} <= set(names)
