"""Screens on the content (``--fov auto``, the default) against the whole-frame screens (``--fov none``, the default
before it) on the shared CVC-ColonDB (167 frames, 15 sequences as groups) and Kvasir-SEG (1000 frames; the
converter's ``neardup_<k>`` groups): confirmed within-group pairs drop by at most 5 %, no pair of two groups is
confirmed, and Kvasir-SEG's identical-image pairs (PROVENANCE.md) keep an identical pHash. Slow: both sets are
prepared and audited twice (about 2-3 min on 2 shared cores); the numbers are in docs/audit.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from msb.audit.calibration import pair_kinds
from msb.audit.core import AuditConfig, run_audit
from msb.data.converters import prepare_dataset

IDENTICAL = [("cju30bmab08bi0835mvlr6e0r", "cju77k828z46w0871r0avuoo9"),
             ("cju76lsehyia10987u54vn8rb", "cju772304yw5t0818vbw8kkjf"),
             ("cju886ryxnsl50801r93jai7q", "cju8amfdtqi4x09871tygrgqe")]


def _counts(result) -> tuple[int, int]:
    p = result.pairs
    cross, within = pair_kinds(result.rows, p["a"].to_numpy(), p["b"].to_numpy())
    conf = p["confirmed"].to_numpy(bool)
    return int((conf & within).sum()), int((conf & cross).sum())


@pytest.mark.slow
@pytest.mark.shared_data
@pytest.mark.parametrize("name,converter", [("cvc-colondb", "cvc-colondb"), ("kvasir-seg", "kvasir-seg")])
def test_content_screens_keep_within_group_pairs(shared_dir: Path, tmp_path: Path, name: str, converter: str) -> None:
    src = shared_dir / "data" / name
    if not (src / "images").is_dir():
        pytest.skip(f"{src}: shared data set absent")
    ds = tmp_path / name
    prepare_dataset(converter, src, ds)
    frame = run_audit(ds, config=AuditConfig(fov="none"))
    content = run_audit(ds)
    (w0, c0), (w1, c1) = _counts(frame), _counts(content)
    print(f"{name}: within-group confirmed pairs whole frame {w0}, content {w1}; cross-group {c0} -> {c1}")
    assert w0 > 0 and w1 >= 0.95 * w0
    assert c1 <= c0
    if name == "kvasir-seg":
        lab = content.rows.set_index("sample_id")["cluster_identical_phash"]
        assert all(lab[a] == lab[b] for a, b in IDENTICAL)
