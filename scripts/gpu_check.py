"""One-GPU check of the CUDA path (issue 19): training throughput per architecture and precision, how close to
the GPU's bf16 peak, the determinism check, the profiling table, a 1-GPU nccl DDP smoke run; a Markdown report.

    python scripts/gpu_check.py --out gpu_check            # on the GPU machine (about 5-8 minutes on an H200)
    python scripts/gpu_check.py --dry-run --out /tmp/gc    # on CPU: every step at toy sizes, no CUDA call

Sections (all written to ``OUT/gpu_check.md``, with ``OUT/profile/profile_cuda.{csv,tex}``):

1. training: one epoch of every architecture (``configs/architectures/*.yaml``, model section only) at 352 x 352,
   batch 16, under bf16, fp16 and fp32 (``train.precision``), synthetic data, no augmentation; images/s of the
   training loop, ``torch.cuda.max_memory_allocated`` peak, achieved TFLOP/s = 3 x forward FLOPs per image
   (``torch.utils.flop_counter``, :func:`msb.profiling.flops.count_flops`; backward ~ 2 x forward) x images/s,
   the fraction of the bf16 dense peak (989 TFLOP/s for an H200 SXM from NVIDIA's data sheet, and the issue's
   790 TFLOP/s figure: both printed), the mean GPU utilisation (pynvml, sampled every 0.1 s) and the share of the
   epoch spent waiting on the DataLoader; the bottleneck is called ``input pipeline`` when that share is over
   20 %, else ``GPU``. Then U-Net R34 bf16 at batch 64 (the issue's goal: >= 30 % of the bf16 peak).
2. determinism: U-Net R18 trained twice for one epoch under ``full_determinism`` (fp32): identical weights?
3. profiling: ``msb profile`` of every registered architecture at 256 and 512, batch 1 (reduced protocol
   ``--warmup 50 --timed-passes 200 --repeats 3`` to fit the time; ``--full-protocol`` = the paper's 100 + 5 x 1,000).
4. DDP: ``msb run STUDY --nproc-per-node 1`` on a tiny synthetic study (nccl on the GPU, gloo in the dry run).

A section that fails is reported with its one-line error; the others still run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before any cuBLAS handle exists (determinism check)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import yaml  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from msb.config.generate import GeneratedRun, config_hash  # noqa: E402
from msb.config.schema import RunConfig  # noqa: E402
from msb.data.cache import build_cache  # noqa: E402
from msb.data.schema import load_prepared_dataset  # noqa: E402
from msb.data.synth import make_synthetic_dataset  # noqa: E402
from msb.engine.determinism import seed_everything  # noqa: E402
from msb.engine.runner import build_trainer, ensure_split  # noqa: E402
from msb.models.registry import build_model  # noqa: E402
from msb.profiling.flops import count_flops  # noqa: E402

#: dense bf16 peak of an H200 SXM (NVIDIA data sheet, without sparsity), and the figure issue 19 compares with
PEAK_TFLOPS = {"H200 data sheet": 989.0, "issue 19": 790.0}
INPUT_WAIT_LIMIT = 0.20  # share of the epoch waiting on the DataLoader above which the input pipeline is the limit


class UtilSampler:
    """Mean GPU utilisation (%) from ``pynvml.nvmlDeviceGetUtilizationRates`` sampled every 0.1 s; NaN without
    NVML (and always in the dry run)."""

    def __init__(self, enabled: bool) -> None:
        self.samples: list[int] = []
        self.enabled, self._stop = enabled, threading.Event()

    def __enter__(self) -> "UtilSampler":
        if self.enabled:
            try:
                import pynvml

                pynvml.nvmlInit()
                handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())

                def loop() -> None:
                    while not self._stop.wait(0.1):
                        self.samples.append(int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu))

                self._thread = threading.Thread(target=loop, daemon=True)
                self._thread.start()
            except Exception:  # no NVML: the column stays NaN
                self.enabled = False
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()

    @property
    def mean(self) -> float:
        return sum(self.samples) / len(self.samples) if self.samples else float("nan")


def _model_section(arch_file: Path) -> dict[str, Any]:
    return yaml.safe_load(arch_file.read_text())["model"]


def _config(work: Path, data_root: Path, model: dict, size: int, batch: int, precision: str, device: str,
            workers: int, determinism: bool = False, epochs: int = 1) -> RunConfig:
    return RunConfig.model_validate({
        "study": "gpu_check", "run_root": str(work / "runs"), "random_seed": 0, "full_determinism": determinism,
        "data": {"name": "synthetic", "root": str(data_root), "input_size": [size, size], "num_workers": workers,
                 "cache_dir": str(work / "cache"),
                 "split": {"mode": "random", "val_fraction": 0.1, "test_fraction": 0.1, "seed": 0}},
        "model": model,
        "train": {"epochs": epochs, "batch_size": batch, "precision": precision, "device": device,
                  "augment": {"hflip": 0.0, "vflip": 0.0}, "persistent_workers": workers > 0},
        "evaluation": {"compute_metrics": False}})


def train_one(cfg: RunConfig, run_dir: Path, cuda: bool) -> dict[str, Any]:
    """Train ``cfg`` in a fresh ``run_dir``; images/s, peak memory, DataLoader wait, GPU utilisation, weights."""
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    run = GeneratedRun(run_dir.name, cfg, config_hash(cfg), "synthetic", cfg.model.arch)
    ds = load_prepared_dataset(cfg.data.root)
    splits = ensure_split(cfg, ds, run_dir)
    cache = build_cache(ds, cfg.data.input_size, cfg.data.cache_dir)
    ids = {k: sorted(s for s, v in splits.items() if v == k) for k in ("train", "val")}
    seed_everything(cfg.random_seed)
    trainer = build_trainer(run, run_dir, ds, cache, ids["train"], ids["val"], lambda it, *_: it, lambda _m: None,
                            None)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    with UtilSampler(cuda) as util:
        res = trainer.fit()
    row = res.history[-1]
    return {"images_per_s": row["train_images_per_s"], "train_s": row["train_seconds"],
            "wait_share": trainer.data_wait_s / max(row["train_seconds"], 1e-9),
            "peak_mib": torch.cuda.max_memory_allocated() / 2**20 if cuda else float("nan"),
            "gpu_util": util.mean, "precision": trainer.precision.name, "model": trainer.model}


def forward_gflops(model: torch.nn.Module, size: int, device: torch.device) -> float:
    """Forward GFLOPs per image at ``size`` x ``size`` (FlopCounterMode, 2 FLOPs per multiply-accumulate)."""
    x = torch.zeros(1, 3, size, size, device=device)
    return count_flops(model, x).flops / 1e9


def _md_table(header: list[str], rows: list[list[Any]]) -> str:
    fmt = [" | ".join(header), " | ".join("---" for _ in header)]
    fmt += [" | ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in r) for r in rows]
    return "\n".join(f"| {line} |" for line in fmt)


def section_training(a: argparse.Namespace, work: Path, data_root: Path, cuda: bool, out: list[str]) -> None:
    dev = "cuda" if cuda else "cpu"
    rows, goal = [], []
    for arch_file in a.arch_files:
        model = _model_section(arch_file)
        flops = None
        for prec in ("bf16", "fp16", "fp32"):
            name = f"{arch_file.stem}/{prec}"
            try:
                cfg = _config(work, data_root, model, a.size, a.batch, prec, dev, a.workers)
                r = train_one(cfg, work / "train" / f"{arch_file.stem}_{prec}", cuda)
                if flops is None:
                    flops = forward_gflops(r["model"], a.size, torch.device(dev))
                tflops = 3 * flops * r["images_per_s"] / 1e3
                limit = "input pipeline" if r["wait_share"] > INPUT_WAIT_LIMIT else ("GPU" if cuda else "compute")
                rows.append([name, r["precision"], r["images_per_s"], r["peak_mib"], tflops,
                             *(100 * tflops / p for p in PEAK_TFLOPS.values()), r["gpu_util"],
                             100 * r["wait_share"], limit])
            except Exception as exc:  # noqa: BLE001 - reported in the table, the check goes on
                rows.append([name, prec, "failed: " + str(exc).splitlines()[0][:160], "", "", "", "", "", "", ""])
            print(" | ".join(str(v) for v in rows[-1]), flush=True)
        if arch_file.stem == a.goal_arch:
            try:
                cfg = _config(work, data_root, model, a.size, a.goal_batch, "bf16", dev, a.workers)
                r = train_one(cfg, work / "train" / "goal", cuda)
                tflops = 3 * (flops or forward_gflops(r["model"], a.size, torch.device(dev))) * r["images_per_s"] / 1e3
                goal = [[f"{arch_file.stem}/bf16 batch {a.goal_batch}", r["images_per_s"], tflops,
                         *(100 * tflops / p for p in PEAK_TFLOPS.values()), r["gpu_util"], 100 * r["wait_share"]]]
            except Exception as exc:  # noqa: BLE001
                goal = [[f"{arch_file.stem}/bf16 batch {a.goal_batch}", "failed: " + str(exc).splitlines()[0][:160],
                         "", "", "", "", ""]]
    peaks = [f"% of {v:.0f} ({k})" for k, v in PEAK_TFLOPS.items()]
    out += [f"## Training: one epoch at {a.size} x {a.size}, batch {a.batch}, {a.workers} DataLoader workers", "",
            _md_table(["architecture/precision", "ran as", "images/s", "peak MiB", "TFLOP/s (3 x fwd)", *peaks,
                       "GPU util %", "DataLoader wait %", "bottleneck"], rows), ""]
    if goal:
        out += [f"### Goal: {a.goal_arch} bf16 at batch {a.goal_batch} (>= 30 % of the bf16 peak)", "",
                _md_table(["run", "images/s", "TFLOP/s", *peaks, "GPU util %", "DataLoader wait %"], goal), ""]


def section_determinism(a: argparse.Namespace, work: Path, data_root: Path, cuda: bool, out: list[str]) -> None:
    dev = "cuda" if cuda else "cpu"
    model = _model_section(REPO / "configs" / "architectures" / "unet_r18.yaml")
    try:
        states = []
        for k in range(2):
            cfg = _config(work, data_root, model, a.size, a.batch, "fp32", dev, 0, determinism=True)
            r = train_one(cfg, work / "det" / f"run{k}", cuda)
            states.append({n: t.detach().cpu().clone() for n, t in r["model"].state_dict().items()})
        same = all(torch.equal(states[0][n], states[1][n]) for n in states[0])
        text = f"two full_determinism runs (U-Net R18, fp32, 1 epoch): weights {'identical' if same else 'DIFFER'}"
    except Exception as exc:  # noqa: BLE001
        text = "determinism check failed: " + str(exc).splitlines()[0][:300]
    print(text, flush=True)
    out += ["## Determinism", "", text, ""]


def section_profile(a: argparse.Namespace, work: Path, cuda: bool, out: list[str]) -> None:
    from msb.profiling.pipeline import run_profile
    from msb.profiling.timing import TimingProtocol

    proto = TimingProtocol(*a.protocol, batch_size=1, precision="fp32")
    try:
        res = run_profile("cuda" if cuda else "cpu", a.profile_archs, None, [(s, s) for s in a.profile_sizes],
                          [proto], work / "profile")
        t = res.table
        rows = [[r["model"], f"{r['input_h']}", r["params_m"], r["gmacs"], r["latency_ms_median"], r["latency_ms_sd"],
                 r["throughput_ips"], r["peak_mem_mib"] if cuda else r["peak_mem_delta_mib"], r["status"]]
                for _, r in t.iterrows()]
        out += [f"## Profiling: batch 1, {proto.warmup} warm-up + {proto.repeats} x {proto.timed_passes} timed passes, "
                f"fp32, forward only", "",
                _md_table(["model", "input", "params M", "GMACs", "latency ms median", "SD", "images/s",
                           "peak MiB", "status"], rows), "", f"CSV/LaTeX: {', '.join(str(p) for p in res.paths)}", ""]
    except Exception as exc:  # noqa: BLE001
        out += ["## Profiling", "", "failed: " + str(exc).splitlines()[0][:300], ""]
    print(out[-2 if out[-1] == "" else -1][:200], flush=True)


def section_ddp(work: Path, cuda: bool, out: list[str]) -> None:
    proj = work / "ddp"
    shutil.rmtree(proj, ignore_errors=True)
    (proj / "configs" / "datasets").mkdir(parents=True)
    (proj / "configs" / "architectures").mkdir()
    shutil.copy(REPO / "configs" / "global.yaml", proj / "configs" / "global.yaml")
    shutil.copy(REPO / "configs" / "architectures" / "unet_r18.yaml", proj / "configs" / "architectures")
    (proj / "configs" / "datasets" / "synthetic.yaml").write_text(yaml.safe_dump({"data": {
        "name": "synthetic", "root": str(proj / "data"), "input_size": [64, 64],
        "prepare": {"converter": "synthetic", "options": {"n_samples": 24, "seed": 0, "size": [64, 64]}}}}))
    study = proj / "configs" / "study.yaml"
    study.write_text(yaml.safe_dump({"study": "ddp", "run_root": str(proj / "runs"), "datasets": ["synthetic"],
                                     "architectures": ["unet_r18"], "overrides": {
                                         "train": {"epochs": 1, "batch_size": 4},
                                         "evaluation": {"compute_metrics": False}}}))
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "msb", "run", str(study), "--nproc-per-node", "1"], cwd=REPO,
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=600)
    manifests = [m for m in (proj / "runs" / "ddp").glob("*/manifest.json") if not m.parent.name.startswith("_")]
    training = json.loads(manifests[0].read_text()).get("training", {}) if manifests else {}
    ok = r.returncode == 0 and training.get("world_size") == 1
    text = (f"`msb run STUDY --nproc-per-node 1`: exit {r.returncode}, backend {training.get('backend')}, "
            f"{time.perf_counter() - t0:.0f} s: {'OK' if ok else 'FAILED ' + (r.stderr.strip().splitlines() or [''])[-1][:300]}")
    print(text, flush=True)
    out += ["## DDP smoke run", "", text, ""]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dry-run", action="store_true", help="CPU, toy sizes, no CUDA call (for CI)")
    p.add_argument("--out", type=Path, default=Path("gpu_check"), help="folder for gpu_check.md and the work files")
    p.add_argument("--workers", type=int, default=8, help="DataLoader workers of the training section")
    p.add_argument("--full-protocol", action="store_true", help="profiling: 100 warm-up + 5 x 1,000 passes")
    a = p.parse_args(argv)
    cuda = not a.dry_run
    if cuda and not torch.cuda.is_available():
        print("gpu_check: torch.cuda.is_available() is False; run with --dry-run on a machine without a GPU",
              file=sys.stderr)
        return 2
    archs = sorted((REPO / "configs" / "architectures").glob("*.yaml"))
    if a.dry_run:
        a.size, a.batch, a.goal_batch, a.workers, n = 32, 4, 8, 0, 16
        a.arch_files, a.goal_arch = [REPO / "configs" / "architectures" / "unet_r18.yaml"], "unet_r18"
        a.profile_archs, a.profile_sizes, a.protocol = ["unet"], [32], (0, 1, 1)
    else:
        a.size, a.batch, a.goal_batch, n = 352, 16, 64, 320
        a.arch_files, a.goal_arch = archs, "unet_r34"
        a.profile_archs, a.profile_sizes = [], [256, 512]
        a.protocol = (100, 1000, 5) if a.full_protocol else (50, 200, 3)
    work = a.out.resolve()
    work.mkdir(parents=True, exist_ok=True)
    data_root = work / f"synthetic_{a.size}"
    if not (data_root / "index.csv").is_file():
        make_synthetic_dataset(data_root, n_samples=n, size=(a.size, a.size), seed=0)
    t0 = time.perf_counter()
    from msb.profiling.environment import environment_info

    env = environment_info(torch.device("cuda" if cuda else "cpu"))
    out = ["# gpu_check" + (" (dry run, CPU, toy sizes)" if a.dry_run else ""), "",
           f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {env['device_name']}; driver "
           f"{env['driver_version'] or '-'}; torch {env['torch']} (CUDA {env['cuda_runtime'] or '-'}, cuDNN "
           f"{env['cudnn_version'] or '-'}); smp {env['segmentation_models_pytorch']}; timm {env['timm']}", ""]
    for name, fn in (("training", lambda: section_training(a, work, data_root, cuda, out)),
                     ("determinism", lambda: section_determinism(a, work, data_root, cuda, out)),
                     ("profile", lambda: section_profile(a, work, cuda, out)),
                     ("ddp", lambda: section_ddp(work, cuda, out))):
        try:
            fn()
        except Exception:  # noqa: BLE001 - a broken section must not hide the others
            out += [f"## {name}", "", "crashed: " + traceback.format_exc().strip().splitlines()[-1], ""]
    out += [f"Total {time.perf_counter() - t0:.0f} s.", ""]
    (work / "gpu_check.md").write_text("\n".join(out))
    print(f"written: {work / 'gpu_check.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
