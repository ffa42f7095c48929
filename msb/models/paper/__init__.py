"""The architectures of the MedSegBenchmarker case study (paper section 4.1, Table 3), written in plain PyTorch
from each paper and its official code, each a registered :class:`~msb.models.base.Segmentor`."""
