"""The package's layout rules, checked on its real import graph (grimp; function-level imports included,
``if TYPE_CHECKING:`` imports excluded): no import circles, the run-folder stages never import the study
pipeline, no module over 450 lines."""

from __future__ import annotations

from pathlib import Path

import grimp
import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

import msb

PKG = Path(msb.__file__).parent


def _graph() -> tuple[list[str], dict[str, set[str]]]:
    g = grimp.build_graph("msb", exclude_type_checking_imports=True, cache_dir=None)  # no .grimp_cache in the tree
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
    assert "msb.study.pipeline" in deps["msb.cli"]


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
