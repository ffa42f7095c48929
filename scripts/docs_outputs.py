#!/usr/bin/env python3
"""Regenerate (or check) the output blocks of README.md from real runs: no output block is typed by hand.

    python scripts/docs_outputs.py            # run the quickstart in a temporary folder, rewrite README.md's block
    python scripts/docs_outputs.py --check    # the same run; exit 1 with a diff when README.md differs
    python scripts/docs_outputs.py --seeds 0 1 2   # also: the quickstart's numbers over random seeds (how much
                                                   # they vary; printed, for the README's sentence on variation)
    python scripts/docs_outputs.py --disk-table    # only docs/studies.md's bytes-per-run table (every shipped
                                                   # architecture config built at 1 class, files serialised)
    python scripts/docs_outputs.py --audit [--check]   # only docs/audit.md's verdict lines (shared Kvasir-SEG)
                                                       # and the require_audit refusal (synthetic project)

The block sits between ``<!-- docs-output: quickstart -->`` and ``<!-- /docs-output -->`` in README.md: the end of
``msb run configs/study.yaml`` as a terminal of 100 columns shows it (the leaderboard, the paired comparison, the
statistics setting, the report hint), with the temporary run root written as ``runs``. The run copies
``configs/`` into a temporary folder and runs there, so nothing is written into the source tree (the dataset is
generated in the temporary folder). ``tests/e2e/test_docs_outputs.py`` runs :func:`quickstart_block` on a fresh
folder and compares it with README.md.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
BEGIN, END = "<!-- docs-output: quickstart -->", "<!-- /docs-output -->"
WIDTH = 100


def run_quickstart(work: Path, seed: int | None = None) -> str:
    """Run the quickstart study in ``work`` (a copy of ``configs/``; ``seed``: ``random_seed`` override) and return
    what ``msb run`` printed (stdout + stderr, as a 100-column terminal would show it).

    Raises:
        RuntimeError: ``msb run`` failed (its output attached).
    """
    shutil.copytree(REPO / "configs", work / "configs", dirs_exist_ok=True)
    study = work / "configs" / "study.yaml"
    if seed is not None:
        text = study.read_text().replace("overrides:\n", f"overrides:\n  random_seed: {seed}\n", 1)
        study.write_text(text)
    env = {**os.environ, "COLUMNS": str(WIDTH), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO),
           "TERM": "dumb", "NO_COLOR": "1"}
    r = subprocess.run([sys.executable, "-m", "msb", "run", str(study), "--run-root", str(work / "runs"),
                        "--format", "table"], cwd=work, env=env, capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(f"msb run failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return (r.stdout + r.stderr).replace(str(work / "runs"), "runs")


def closing_block(output: str) -> str:
    """The closing block of ``msb run``'s output: from the first leaderboard title to the ``full report`` line.

    Raises:
        ValueError: no leaderboard in ``output``.
    """
    lines = output.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.strip().startswith("Leaderboard ")), None)
    end = next((i for i, ln in enumerate(lines) if ln.startswith("full report")), None)
    if start is None or end is None:
        raise ValueError("no leaderboard / 'full report' line in the output of msb run")
    return "\n".join(ln.rstrip() for ln in lines[start:end + 1]) + "\n"


def quickstart_block(work: Path) -> str:
    """:func:`closing_block` of a fresh quickstart run in ``work``."""
    return closing_block(run_quickstart(work))


def readme_block(text: str, begin: str = BEGIN) -> str:
    """The generated block after the marker ``begin`` (``<!-- docs-output: NAME -->``) up to ``END``, without the
    code fence.

    Raises:
        ValueError: the markers are missing.
    """
    m = re.search(re.escape(begin) + r"\n```text\n(.*?)```\n" + re.escape(END), text, re.S)
    if m is None:
        raise ValueError(f"no block between {begin} and {END}")
    return m.group(1)


def replace_block(text: str, block: str, begin: str = BEGIN) -> str:
    """``text`` with the generated block after ``begin`` replaced by ``block``."""
    return re.sub(re.escape(begin) + r"\n```text\n.*?```\n" + re.escape(END),
                  lambda _: f"{begin}\n```text\n{block}```\n{END}", text, flags=re.S)


AUDIT_DOC = REPO / "docs" / "audit.md"
AUDIT_KVASIR, AUDIT_GATE = "<!-- docs-output: audit-kvasir -->", "<!-- docs-output: audit-gate -->"


def _msb(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": str(WIDTH), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "msb", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=3600)


def audit_kvasir_block(work: Path, shared: Path = REPO.parent / "shared") -> str:
    """The three verdict lines of docs/audit.md: the shared Kvasir-SEG (1,000 frames) prepared with
    ``msb data prepare kvasir-seg``, audited with ``--fail-on crossing-near-duplicate`` on a random split
    (``resolve_splits(index, "random", 0.2, 0.2, seed=0)``) and on the same split drawn by the converter's
    ``group`` column, then without ``--fail-on``.

    Raises:
        FileNotFoundError: ``../shared/data/kvasir-seg`` is absent. RuntimeError: a command failed unexpectedly.
    """
    import pandas as pd

    sys.path.insert(0, str(REPO))
    from msb.data.splits import resolve_splits

    src = shared / "data" / "kvasir-seg"
    if not src.is_dir():
        raise FileNotFoundError(f"{src}: the shared Kvasir-SEG is needed for the audit block")
    work.mkdir(parents=True, exist_ok=True)
    ds = work / "kvasir_seg"
    r = _msb(["data", "prepare", "kvasir-seg", "--source", str(src), "--out", str(ds)], work)
    if r.returncode != 0:
        raise RuntimeError(r.stdout[-2000:] + r.stderr[-2000:])
    index = pd.read_csv(ds / "index.csv", dtype=str, keep_default_na=False)
    lines = []
    for name, group, fail_on in (("random", None, True), ("grouped", "group", True), ("grouped", "group", False)):
        split = resolve_splits(index, "random", 0.2, 0.2, seed=0, group_column=group)
        f = work / f"split_{name}.csv"
        pd.DataFrame({"sample_id": index["sample_id"], "split": split.to_numpy()}).to_csv(f, index=False)
        args = ["audit", str(ds), "--split-file", str(f), "--out", str(work / f"audit_{name}_{fail_on}"),
                "--format", "table"] + (["--fail-on", "crossing-near-duplicate"] if fail_on else [])
        r = _msb(args, work)
        if r.returncode not in (0, 3):
            raise RuntimeError(r.stdout[-2000:] + r.stderr[-2000:])
        lines.append([ln for ln in (r.stdout + r.stderr).splitlines() if ln.startswith("audit verdict:")][-1])
    return "\n".join(lines) + "\n"


def audit_gate_block(work: Path) -> str:
    """The refusal of ``data.require_audit`` in docs/audit.md: the tests' synthetic project (24 frames in 8
    groups, ``tests/study/conftest.py::write_project``) with ``require_audit: [crossing-group]`` and an ungrouped
    split; the one line ``msb run`` prints (exit 2), the temporary folder left out of the path."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_conftest_docs", REPO / "tests" / "study" / "conftest.py")
    conf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conf)
    work.mkdir(parents=True, exist_ok=True)
    study = conf.write_project(work, {"study": "gate", "overrides": {"data": {
        "require_audit": ["crossing-group"], "split": {"group_column": None}}}})
    r = _msb(["run", str(study)], work)
    if r.returncode != 2:
        raise RuntimeError(f"expected exit 2, got {r.returncode}: {r.stdout[-2000:]} {r.stderr[-2000:]}")
    line = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")][-1]
    return line.replace(str(work) + os.sep, "") + "\n"


def _audit_blocks(check: bool) -> bool:
    """Regenerate (or, with ``check``, compare) docs/audit.md's two blocks; True when they match. The audit
    folder's digest covers file modification times, so the gate line is compared with it masked."""
    text = AUDIT_DOC.read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory(prefix="msb-docs-audit-") as tmp:
        kv = audit_kvasir_block(Path(tmp) / "k")
        gate = audit_gate_block(Path(tmp) / "g")
    mask = lambda b: re.sub(r"audits/[0-9a-f]{16}", "audits/<digest>", b)  # noqa: E731
    same = (readme_block(text, AUDIT_KVASIR) == kv and mask(readme_block(text, AUDIT_GATE)) == mask(gate))
    if not check:
        AUDIT_DOC.write_text(replace_block(replace_block(text, kv, AUDIT_KVASIR), gate, AUDIT_GATE), encoding="utf-8")
        print(f"{AUDIT_DOC}: audit blocks rewritten")
    else:
        print(f"{AUDIT_DOC}: audit blocks {'identical to' if same else 'DIFFER from'} fresh runs")
    return same


STUDIES = REPO / "docs" / "studies.md"
DISK_BEGIN = "<!-- docs-output: disk-table -->"


def disk_table() -> str:
    """Markdown table: for every shipped architecture config (1 foreground class, random init), the bytes of one
    checkpoint file (``checkpoints/<role>.pt`` as msb writes it), of a run's two checkpoints (best + latest), and
    of the full resume state kept with ``checkpoint.keep_resume_state`` (weights + AdamW's two moments + RNG),
    each measured by serialising the files in memory (``torch.save``), not estimated."""
    import io

    import torch

    sys.path.insert(0, str(REPO))
    from msb.cli.catalog import architecture_model_configs
    from msb.config.schema import ModelConfig
    from msb.engine.determinism import get_rng_state
    from msb.models.registry import build_model
    from msb.models.safe_io import to_safe

    def size(obj) -> int:
        buf = io.BytesIO()
        torch.save(to_safe(obj), buf)
        return len(buf.getvalue())

    rows = ["| architecture config | parameters | one checkpoint (bytes) | a run: best + latest (bytes) | "
            "full resume state, kept on request (bytes) |", "| --- | ---: | ---: | ---: | ---: |"]
    for name, mcfg in sorted(architecture_model_configs(REPO / "configs").items()):
        mcfg = mcfg if isinstance(mcfg, ModelConfig) else ModelConfig.model_validate(mcfg)
        net = build_model(mcfg, 1)
        sd = net.state_dict()
        ckpt = size({"model": sd, "epoch": 1, "epoch_base": 1, "arch": mcfg.arch, "num_classes": 1,
                     "config_hash": "0" * 64})
        params = [q for q in net.parameters() if q.requires_grad]
        opt = {"state": {i: {"step": torch.tensor(1.0), "exp_avg": torch.zeros_like(q),
                             "exp_avg_sq": torch.zeros_like(q)} for i, q in enumerate(params)},
               "param_groups": [{"lr": 1e-3, "params": list(range(len(params)))}]}
        state = size({"model": sd, "optimizer": opt, "rng": get_rng_state(), "epoch": 1, "history": []})
        n = sum(q.numel() for q in net.parameters())
        rows.append(f"| `{name}` | {n / 1e6:,.2f} M | {ckpt:,} | {2 * ckpt:,} | {state:,} |")
    return "\n".join(rows) + "\n"


def _write_disk_table() -> None:
    text = STUDIES.read_text(encoding="utf-8")
    pat = re.escape(DISK_BEGIN) + r"\n.*?" + re.escape(END)
    if not re.search(pat, text, re.S):
        raise ValueError(f"{STUDIES}: no block between {DISK_BEGIN} and {END}")
    STUDIES.write_text(re.sub(pat, lambda _: f"{DISK_BEGIN}\n{disk_table()}{END}", text, flags=re.S),
                       encoding="utf-8")
    print(f"{STUDIES}: bytes-per-run table rewritten")


def _leader_numbers(output: str) -> list[str]:
    return [ln for ln in closing_block(output).splitlines() if re.match(r"^[│|]\s+\d+\s+[│|]", ln)
            or ln.startswith("Dice ")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare instead of rewriting README.md")
    ap.add_argument("--seeds", type=int, nargs="*", default=None, help="also run these random seeds and print "
                                                                         "their leaderboard rows")
    ap.add_argument("--disk-table", action="store_true", help="only rewrite docs/studies.md's bytes-per-run table")
    ap.add_argument("--audit", action="store_true", help="only docs/audit.md's blocks (needs ../shared; minutes)")
    args = ap.parse_args(argv)
    if args.disk_table:
        _write_disk_table()
        return 0
    if args.audit:
        return 0 if _audit_blocks(args.check) or not args.check else 1
    with tempfile.TemporaryDirectory(prefix="msb-docs-") as tmp:
        block = quickstart_block(Path(tmp))
    text = README.read_text(encoding="utf-8")
    old = readme_block(text)
    if args.check:
        if old != block:
            sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), block.splitlines(True), "README.md",
                                                       "msb run"))
            return 1
        print("README.md quickstart block: identical to a fresh run")
    elif old != block:
        README.write_text(replace_block(text, block), encoding="utf-8")
        print("README.md quickstart block rewritten")
    else:
        print("README.md quickstart block unchanged")
    for seed in args.seeds or []:
        with tempfile.TemporaryDirectory(prefix=f"msb-docs-seed{seed}-") as tmp:
            print(f"random_seed {seed}:")
            for ln in _leader_numbers(run_quickstart(Path(tmp), seed)):
                print("  " + ln)
    return 0


if __name__ == "__main__":
    sys.exit(main())
