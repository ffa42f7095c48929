"""``msb profile``: parameters, GMACs, latency, throughput and peak memory per architecture and input size."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from msb.cli.format import FORMAT_HELP, emit_frame, resolve_format, status_log
from msb.errors import MSBError


app = typer.Typer()  # merged into the ``msb`` app by :mod:`msb.cli.app`


def profile_frame(t):
    """The profile table's columns with raw numbers (for ``--format csv|json|markdown``).

    Args:
        t: the table of :func:`msb.profiling.pipeline.run_profile` (``model``, ``input_h``, ``input_w``,
            ``precision``, ``params_m``, ``gmacs``, ``latency_ms_median``, ``latency_ms_sd``, ``throughput_ips``,
            ``peak_mem_mib`` / ``peak_mem_delta_mib``, ``device``, ``status``).

    Returns:
        DataFrame with ``model``, ``input`` (``HxW``), ``precision``, ``params (M)``, ``GMACs``,
        ``latency ms (median)``, ``latency ms (SD)``, ``images/s``, ``peak MiB`` (CUDA peak allocation; on the
        CPU the resident-memory increase), ``status``. ``GMACs`` follows the named convention ``conv+linear``
        (:data:`msb.profiling.flops.CONVENTION`); ``GMACs attention`` are the attention matrix products beside it;
        ``GMACs calflops`` the count of calflops, which MSB Table 3 follows (:mod:`msb.profiling.tree_macs`).
    """
    import pandas as pd

    mem = t["peak_mem_mib"].where(t["device"] == "cuda", t["peak_mem_delta_mib"])
    return pd.DataFrame({"model": t["model"], "input": t["input_h"].astype(str) + "x" + t["input_w"].astype(str),
                         "precision": t["precision"], "params (M)": t["params_m"], "GMACs": t["gmacs"],
                         "GMACs attention": t["gmacs_attention"], "GMACs calflops": t["gmacs_calflops"],
                         "latency ms (median)": t["latency_ms_median"], "latency ms (SD)": t["latency_ms_sd"],
                         "images/s": t["throughput_ips"], "peak MiB": mem, "status": t["status"]}).reset_index(drop=True)


@app.command(context_settings={"allow_extra_args": True})
def profile(ctx: typer.Context,
            device: str = typer.Option("cpu", help="cpu | cuda (fails with one line when no GPU is usable)."),
            arch: Optional[List[str]] = typer.Option(None, help="Architecture configs as a study names them "
                                                     "(--arch unet_r18 segformer_b0; `msb models` lists them) or "
                                                     "registry adapters; default: every architecture config."),
            configs: Path = typer.Option(Path("configs"), help="Configs root holding architectures/."),
            study: Optional[Path] = typer.Option(None, help="Study folder runs/<study>/: its models + Dice scatter."),
            input_size: Optional[List[str]] = typer.Option(None, help="Sizes in px: --input-size 256 512 (or HxW)."),
            batch_size: int = typer.Option(1, help="Images per forward pass."),
            precision: Optional[List[str]] = typer.Option(None, help="fp32 | amp (--precision fp32 amp); default fp32."),
            warmup: Optional[int] = typer.Option(None, help="Untimed warm-up passes (default 100 cuda, 10 cpu)."),
            timed_passes: Optional[int] = typer.Option(None, help="Timed passes per repeat (1000 cuda, 100 cpu)."),
            repeats: Optional[int] = typer.Option(None, help="Repeats; median, SD over them (5 cuda, 3 cpu)."),
            cudnn_benchmark: bool = typer.Option(True, help="torch.backends.cudnn.benchmark during timing."),
            num_classes: int = typer.Option(1, help="Output classes for --arch models."),
            out: Optional[Path] = typer.Option(None, help="Output folder (default <study>/profile or profiles/)."),
            role: str = typer.Option("best", help="Study: checkpoint role whose counts give Dice."),
            rule: str = typer.Option("image-macro", help="Study: aggregation rule of Dice."),
            x: str = typer.Option("gmacs", help="Study scatter x axis: gmacs | latency."),
            format: Optional[str] = typer.Option(None, "--format", help=FORMAT_HELP + " csv / json: numbers "
                                                 "unrounded, latency median and SD in two columns.")) -> None:
    """Params, GMACs (conv+linear convention; attention products apart), latency, throughput and peak memory per
    architecture and input size."""
    from msb.profiling.measure import parse_input_size
    from msb.profiling.pipeline import run_profile
    from msb.profiling.timing import TimingProtocol, protocol_defaults

    fmt = resolve_format(format)
    log = status_log(fmt)  # stdout carries the table only unless fmt is table
    archs, sizes, precs = list(arch or []), list(input_size or []), list(precision or [])
    d = protocol_defaults(device)  # on cuda the MSB paper's protocol: 100 + 5 x 1,000 passes at 256 and 512
    warmup = d["warmup"] if warmup is None else warmup
    timed_passes = d["timed_passes"] if timed_passes is None else timed_passes
    repeats = d["repeats"] if repeats is None else repeats
    for tok in ctx.args:  # values after the first of a multi-value option (--input-size 256 512)
        if tok.lower().replace("x", "").isdigit():
            sizes.append(tok)
        elif tok in ("fp32", "amp"):
            precs.append(tok)
        elif archs:
            archs.append(tok)
        else:
            raise MSBError(f"msb profile: unexpected argument '{tok}'; name architectures with --arch {tok}")
    if not sizes and not input_size and study is None:
        sizes = list(d["sizes"])
    protocols = [TimingProtocol(warmup, timed_passes, repeats, batch_size, p, cudnn_benchmark)  # type: ignore[arg-type]
                 for p in (precs or ["fp32"])]
    from msb.cli.catalog import architecture_model_configs

    res = run_profile(device, archs, study, [parse_input_size(s) for s in sizes], protocols, out, num_classes,
                      role, rule, x, log=log,
                      model_configs=architecture_model_configs(configs) if study is None else None)
    t = res.table
    title = (f"profile on {t['device_name'].iloc[0]} ({t['device'].iloc[0]}), batch {batch_size}, "
                        f"{warmup} warm-up + {repeats}x{timed_passes} timed passes, forward only")
    table = Table(title=title)
    for col in ("model", "input", "precision", "params (M)", "GMACs", "GMACs attn", "GMACs calflops",
                "latency ms (median ± SD)", "images/s", "peak MiB", "status"):
        table.add_column(col, justify="left" if col in ("model", "input", "precision", "status") else "right")
    for _, r in t.iterrows():
        mem = r["peak_mem_mib"] if r["device"] == "cuda" else r["peak_mem_delta_mib"]
        table.add_row(r["model"], f"{r['input_h']}x{r['input_w']}", r["precision"], f"{r['params_m']:.2f}",
                      f"{r['gmacs']:.3f}", f"{r['gmacs_attention']:.3f}", f"{r['gmacs_calflops']:.3f}",
                      f"{r['latency_ms_median']:.2f} ± {r['latency_ms_sd']:.2f}",
                      f"{r['throughput_ips']:.1f}", f"{mem:.1f}", r["status"])
    emit_frame(profile_frame(t), fmt, title, table)
    uncounted = sorted({o.strip() for s in t["uncounted_ops"] for o in str(s).split(",") if o.strip()})
    from msb.profiling.flops import CONVENTION_TEXT
    from msb.profiling.tree_macs import TREE_CONVENTION

    log(f"{CONVENTION_TEXT}; operators not counted: {', '.join(uncounted) or 'none'}")
    log(f"GMACs calflops = {TREE_CONVENTION}; the reference code's duplicate registrations counted again "
        f"(docs/profiling.md)")
    log(f"peak memory: {t['mem_method'].iloc[0]}")
    log(f"written: {', '.join(str(p) for p in res.paths)}")
