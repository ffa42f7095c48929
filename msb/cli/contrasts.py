"""``msb contrasts STUDY``: the training-pool contrast table and the population ranks of a pool-contrast study
(:mod:`msb.analysis.stats.contrasts`, docs/analysis.md "Training-pool contrasts")."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from msb.cli.format import FORMAT_HELP, emit_frame, resolve_format, status_log
from msb.errors import MSBError

app = typer.Typer()  # merged into the ``msb`` app by :mod:`msb.cli.app`


def _settings(study: Path, run_root: Optional[str]) -> tuple[Path, dict]:
    """The study folder and the ``contrasts`` section of a study file (or ``{}`` for a folder)."""
    if study.is_dir():
        return study, {}
    if not study.is_file():
        raise MSBError(f"{study}: neither a study file nor a study folder; give configs/studies/<name>.yaml or "
                       f"runs/<study>")
    from msb.config.generate import generate_runs, load_study

    spec, _ = load_study(study)
    cfg = generate_runs(study)[0].config
    folder = Path(run_root or cfg.run_root) / cfg.study
    return folder, (spec.contrasts.model_dump() if spec.contrasts is not None else {})


@app.command("contrasts")
def contrasts(study: Path = typer.Argument(..., help="Study file with 'pools' (and 'contrasts'), or its folder "
                                           "runs/<study>."),
              run_root: Optional[str] = typer.Option(None, help="Override run_root of a study file."),
              pair: Optional[List[str]] = typer.Option(None, help="POOL_A:POOL_B, repeatable (default: the "
                                                       "study's contrasts.pairs)."),
              population: Optional[List[str]] = typer.Option(None, help="NAME=SPEC (all | source:A,B | ids:FILE | "
                                                             "flag:FILE[:COLUMN]), repeatable."),
              metric: Optional[str] = typer.Option(None, help="Metric (default dice)."),
              rule: Optional[str] = typer.Option(None, help="Aggregation rule (default image-macro)."),
              checkpoint: Optional[str] = typer.Option(None, help="Checkpoint role evaluated (default best)."),
              n_boot: Optional[int] = typer.Option(None, min=1, help="Bootstrap replicates (default 2000)."),
              local_distant: Optional[List[str]] = typer.Option(None, help="LOCAL:DISTANT (remove_neighbours and "
                                                                "remove_distant pools), repeatable: the exploratory "
                                                                "difference-in-differences (default: the study's "
                                                                "contrasts.local_distant)."),
              out: Optional[Path] = typer.Option(None, help="Output folder (default <study folder>/contrasts)."),
              format: Optional[str] = typer.Option(None, "--format", help=FORMAT_HELP + " csv / json: the contrast "
                                                   "table only (ranks in population_ranks.csv).")) -> None:
    """Mean paired differences between training pools over seeds, per evaluation population, with paired-t and
    bootstrap intervals; pools ranked per population with Spearman's rho."""
    from msb.analysis.stats.contrasts import (contrast_table, load_pool_counts, markdown_table, pool_runs,
                                        population_ranks, write_contrasts, INTERVAL_NOTE)

    fmt = resolve_format(format)
    log = status_log(fmt)  # stdout carries the tables only unless fmt is table
    folder, spec = _settings(study, run_root)
    pairs = [tuple(p.split(":", 1)) for p in pair] if pair else [tuple(p) for p in spec.get("pairs", [])]
    if any(len(p) != 2 for p in pairs):
        raise MSBError(f"--pair {pair}: expected POOL_A:POOL_B")
    if not pairs:
        raise MSBError(f"{study}: no pairs; give --pair POOL_A:POOL_B or contrasts.pairs in the study file")
    pops = spec.get("populations") or {"all": "all"}
    if population:
        pops = {}
        for item in population:
            name, sep, text = item.partition("=")
            if not sep or not name or not text:
                raise MSBError(f"--population {item!r}: expected NAME=SPEC, e.g. other=source:colondb,bkai")
            pops[name] = text
    metric = metric or spec.get("metric", "dice")
    rule = rule or spec.get("rule", "image-macro")
    runs = pool_runs(folder, checkpoint or spec.get("checkpoint", "best"))
    counts = load_pool_counts(runs)
    table = contrast_table(counts, pairs, pops, metric, rule, n_boot or spec.get("n_boot", 2000),
                           spec.get("level", 0.95), spec.get("boot_seed", 0))
    ranks, rho = population_ranks(counts, pops, metric, rule)
    paths = write_contrasts(table, ranks, rho, out or folder / "contrasts")
    if fmt == "markdown":  # as contrasts.md and population_ranks.md (floats with 4 decimals)
        for text in (markdown_table(table), INTERVAL_NOTE, markdown_table(ranks), markdown_table(rho)):
            typer.echo(text)  # plain text: Markdown tables must not be folded to the console width
    elif fmt == "table":
        emit_frame(table.round(4), fmt, "Training-pool contrasts")
        log(INTERVAL_NOTE)
        emit_frame(ranks.round(4), fmt, "Pool ranks per population")
        emit_frame(rho.round(4), fmt, "Spearman's rho between populations' ranks")
    else:  # csv / json: pure data, raw numbers
        emit_frame(table, fmt)
        log(INTERVAL_NOTE)
    if any(":" not in x for x in local_distant or []):
        raise MSBError(f"--local-distant {local_distant}: expected LOCAL:DISTANT, e.g. local:distant")
    did_specs = ([{"local": a, "distant": b} for a, b in (x.split(":", 1) for x in local_distant)]
                 if local_distant else spec.get("local_distant") or [])
    if did_specs:
        paths += _local_distant(runs, counts, did_specs, metric, rule, spec.get("level", 0.95),
                                out or folder / "contrasts", fmt, log)
    log(f"{len(runs)} pool runs; written: {', '.join(str(p) for p in paths)}")


def _local_distant(runs, counts, specs: list[dict], metric: str, rule: str, level: float, out: Path, fmt: str,
                   log) -> list[Path]:
    """The exploratory local-versus-distant rows (:mod:`msb.analysis.stats.did`), shown and written as
    ``local_distant.csv`` / ``.md``."""
    import pandas as pd

    from msb.analysis.stats.contrasts import markdown_table
    from msb.analysis.stats.did import DID_NOTE, did_table, local_inputs
    from msb.utils.atomic import atomic_write_text

    rows = []
    for d in specs:
        pairs, train = local_inputs(runs, d["local"])
        rows.append(did_table(counts, d["local"], d["distant"], pairs, train, metric, rule, level,
                              d.get("match_on", ["source", "empty"]), d.get("seed", 0)))
    table = pd.concat(rows, ignore_index=True)
    title = "Local-versus-distant removal, difference-in-differences (EXPLORATORY)"
    if fmt == "table":
        emit_frame(table.round(4), fmt, title)
    elif fmt == "markdown":
        typer.echo(markdown_table(table))
    # csv / json: stdout keeps the contrast table alone; these rows are in local_distant.csv
    log(DID_NOTE)
    files = {"local_distant.csv": table.to_csv(index=False, lineterminator="\n"),
             "local_distant.md": f"## {title}\n\n{markdown_table(table)}\n{DID_NOTE}\n"}
    for name, text in files.items():
        atomic_write_text(out / name, text)
    return [out / n for n in files]
