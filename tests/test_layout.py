"""The package's layout rules, checked on its real import graph (grimp; function-level imports and ``if
TYPE_CHECKING:`` imports included: a type hint ties two modules together as much as a call does): no import
circles, the run-folder stages never import the study pipeline, the post-hoc analysis flows counts -> stats ->
report, no module over 450 lines, no folder with more than 20 modules at one level."""

from __future__ import annotations

from pathlib import Path

import grimp
import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

import msb

PKG = Path(msb.__file__).parent


def _graph() -> tuple[list[str], dict[str, set[str]]]:
    g = grimp.build_graph("msb", exclude_type_checking_imports=False, cache_dir=None)  # no .grimp_cache in the tree
    mods = sorted(g.modules)
    return mods, {m: set(g.find_modules_directly_imported_by(m)) & set(mods) for m in mods}


def test_no_import_circles():
    mods, deps = _graph()
    idx = {m: i for i, m in enumerate(mods)}
    rows = [idx[a] for a in mods for b in deps[a]]
    cols = [idx[b] for a in mods for b in deps[a]]
    adj = csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(mods), len(mods)))
    n, labels = connected_components(adj, directed=True, connection="strong")
    circles = [sorted(m for m in mods if labels[idx[m]] == c) for c in range(n)]
    circles = [c for c in circles if len(c) > 1]
    assert not circles, "import circles: " + "; ".join(" <-> ".join(c) for c in circles)


def test_grimp_sees_function_level_imports():
    # the graph must include imports inside functions (the study pipeline imports engine at module level, the
    # CLI imports everything inside its commands): otherwise the circle test above could not fail
    _, deps = _graph()
    assert "msb.study.pipeline" in deps["msb.cli.run"]


def test_run_folder_stages_never_import_the_study_pipeline():
    _, deps = _graph()
    stages = ("msb.engine", "msb.data", "msb.models", "msb.evaluation", "msb.config")
    bad = sorted(f"{a} -> {b}" for a, bs in deps.items() if a.startswith(stages)
                 for b in bs if b == "msb.study" or b.startswith("msb.study."))
    assert not bad, bad


def test_no_module_over_450_lines():
    long = sorted(f"{p.relative_to(PKG.parent)} ({n} lines)" for p in PKG.rglob("*.py")
                  if (n := len(p.read_text().splitlines())) > 450)
    assert not long, long


def test_graph_counts_type_checking_imports(tmp_path, monkeypatch):
    # a strategy that imported the trainer only for a type hint (the circle this layout removed) must show up
    pkg = tmp_path / "tcpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "trainer.py").write_text("from tcpkg.strategy import S\n")
    (pkg / "strategy.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                     "    from tcpkg.trainer import T\nclass S: ...\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    g = grimp.build_graph("tcpkg", exclude_type_checking_imports=False, cache_dir=None)
    assert g.find_modules_directly_imported_by("tcpkg.strategy") == {"tcpkg.trainer"}


def test_strategies_never_import_the_trainer():
    _, deps = _graph()
    bad = sorted(f"{a} -> msb.engine.trainer" for a, bs in deps.items()
                 if a.startswith("msb.engine.strategies") and "msb.engine.trainer" in bs)
    assert not bad, bad


def test_analysis_flows_counts_stats_report():
    _, deps = _graph()
    order = {"counts": 0, "stats": 1, "report": 2}

    def stage(m: str):
        parts = m.split(".")
        return order.get(parts[2]) if len(parts) > 2 and parts[:2] == ["msb", "analysis"] else None

    bad = sorted(f"{a} -> {b}" for a, bs in deps.items() if stage(a) is not None
                 for b in bs if stage(b) is not None and stage(b) > stage(a))
    assert not bad, bad
    assert any(stage(a) == 2 and stage(b) == 1 for a, bs in deps.items() for b in bs)  # the graph sees the packages


def test_no_folder_over_20_modules():
    crowded = sorted(f"{d.relative_to(PKG.parent)} ({n} modules)" for d in [PKG, *PKG.rglob("*")] if d.is_dir()
                     and (n := len([f for f in d.glob("*.py") if f.name != "__init__.py"])) > 20)
    assert not crowded, crowded


def test_no_command_modules_beside_the_stages():
    assert not sorted(p.name for p in PKG.glob("cli*.py")), "command modules belong in msb/cli/"
