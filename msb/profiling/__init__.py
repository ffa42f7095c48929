"""Profiling stage (``msb profile``): parameters, GMACs, latency, throughput and peak memory per architecture
and input size, measured the same way for every model and recorded with the timing protocol.

Modules: :mod:`~msb.profiling.flops` (FlopCounterMode counts), :mod:`~msb.profiling.tree_macs` (MACs totalled
by registered module name, as calflops; the MSB paper's HiFormer-B* row), :mod:`~msb.profiling.timing` (latency
protocol), :mod:`~msb.profiling.memory` (peak memory), :mod:`~msb.profiling.environment` (device checks, versions),
:mod:`~msb.profiling.measure` (one row per model x size x protocol), :mod:`~msb.profiling.study` (a study's
models and Dice from stored counts), :mod:`~msb.profiling.report` (Parquet/CSV/LaTeX, scatter),
:mod:`~msb.profiling.pipeline` (the command). See ``docs/profiling.md``.
"""

from msb.profiling.flops import FlopCount, count_flops
from msb.profiling.measure import PROFILE_COLUMNS, ProfileTarget, profile_module, profile_targets
from msb.profiling.pipeline import ProfileOutputs, run_profile
from msb.profiling.timing import TimingProtocol

__all__ = ["FlopCount", "count_flops", "PROFILE_COLUMNS", "ProfileTarget", "profile_module", "profile_targets",
           "ProfileOutputs", "run_profile", "TimingProtocol"]
