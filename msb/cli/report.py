"""``msb report``: the study report (HTML + Markdown, summary first) from stored artifacts (no inference)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from msb.cli.common import log
from msb.cli.protocol import ANALYSES_HELP


app = typer.Typer()  # merged into the ``msb`` app by :mod:`msb.cli.app`


@app.command()
def report(study_dir: Path = typer.Argument(..., help="Study folder runs/<study>."),
           out: Optional[Path] = typer.Option(None, help="Report folder (default STUDY_DIR/report)."),
           bootstrap: Optional[int] = typer.Option(None, help="Bootstrap replicates for every CI (0: none; "
                                                              "default: the study's statistics setting)."),
           seed: Optional[int] = typer.Option(None, help="Bootstrap seed (default: the study's statistics setting)."),
           population: Optional[List[str]] = typer.Option(None, help="Extra population: source:A,B | ids:FILE | "
                                                                     "flag:FILE[:COLUMN] (repeatable)."),
           system_by: str = typer.Option("run", help="What a compared system is: run | model."),
           posthoc: str = typer.Option("nemenyi", help="Post-hoc test after Friedman (>= 3 systems): "
                                                       "nemenyi | conover."),
           analyses: Optional[str] = typer.Option("all", help=ANALYSES_HELP + " 'none' omits the section."),
           allow_mixed_protocols: bool = typer.Option(False, "--allow-mixed-protocols",
                                                      help="Let the protocol section rank rows of different split "
                                                           "policies.")) -> None:
    """Self-contained HTML + Markdown report of a study from stored artifacts: contract, scores with CIs,
    significance, ranking sensitivity, figures, LaTeX tables and a reporting checklist."""
    from msb.analysis.stats.populations import parse_population
    from msb.analysis.protocol import parse_analyses
    from msb.analysis.report.report import build_report
    from msb.analysis.stats.significance import check_posthoc

    check_posthoc(posthoc)
    pops = [parse_population(p) for p in population or []]
    names = () if analyses == "none" else parse_analyses(analyses)
    from msb.analysis.stats.setting import find_setting, with_overrides

    setting, source = find_setting([study_dir])  # the setting msb run used for its leaderboard: the same numbers
    setting = with_overrides(setting, bootstrap, seed)
    log(f"statistics setting ({source or 'defaults'}"
        f"{'; --bootstrap/--seed given here' if bootstrap is not None or seed is not None else ''}): "
        f"{setting.describe()}")
    seed = setting.seed
    res = build_report(study_dir, out, populations=pops, system_by=system_by, setting=setting,
                       posthoc=posthoc, protocol={"analyses": names, "seed": seed,
                                                  "allow_mixed_protocols": allow_mixed_protocols})
    for item in res.checklist:
        log(f"{item.status:<4}  {item.item}: {item.evidence}")
    for note in res.notes:
        log(f"note: {note}")
    log(f"report written to {res.html} and {res.markdown} ({len(res.figures)} figure files, "
        f"{len(res.tables)} table files)")
