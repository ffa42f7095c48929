"""Operators that official code ships as custom CUDA kernels, written in plain PyTorch (CPU and GPU), each
dispatching to the compiled kernel when its package is installed and the tensors are on CUDA.

- :mod:`msb.models.ops.dcnv3`: InternImage's deformable convolution v3 core (package ``DCNv3``).
- :mod:`msb.models.ops.aggregated_attention`: TransNeXt's sliding-window part of aggregated attention
  (package ``swattention``).
- :mod:`msb.models.ops.selective_scan`: Mamba's selective scan (package ``mamba_ssm``), used by Swin-UMamba.
"""
