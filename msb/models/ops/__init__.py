"""Operators that official code runs as custom CUDA kernels, each with a pure-PyTorch version that runs everywhere
(and the compiled kernel used when its package is installed)."""
