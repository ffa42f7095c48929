"""A study whose training pool cannot be drawn fails before any run trains (msb.study.pipeline checks every
pool on the run config's split first); the message names the study file, the unit and the pool."""

from __future__ import annotations

import pytest

from msb.errors import MSBError
from msb.study.pipeline import run_study


def test_bad_pool_fails_before_training(tmp_path, make_project):
    study = make_project(tmp_path, {"study": "badpool",
                                    "pools": [{"name": "full", "kind": "full"},
                                              {"name": "no_x", "kind": "remove", "sources": ["x"]}],
                                    "seeds": [0, 1]})
    with pytest.raises(MSBError, match=r"study.yaml \(unit synthetic-unet_tiny-poolno_x-random_seed0\): pool 'no_x' "
                                       r"\(remove\): \['x'\] occur in no training row; sources: \['synthetic'\]"):
        run_study(study)
    assert not list((tmp_path / "runs" / "badpool").glob("*/config.yaml"))  # nothing trained
