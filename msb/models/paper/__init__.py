"""The architectures of the MedSegBenchmarker paper's case study (section 4.1, Table 3), one module each.

Every adapter here is a :class:`~msb.models.base.Segmentor` registered under the name the issue and the configs
use (``configs/architectures/<name>.yaml``), written in plain PyTorch from the papers and the structure of the
official code, with timm / segmentation-models-pytorch backbones where they exist. Their parameter counts
(``sum(p.numel())`` at 3 output maps) and GMACs (the ``conv+linear`` convention of :mod:`msb.profiling.flops`)
match Table 3 (tests/models/test_paper_archs_*.py).
"""
