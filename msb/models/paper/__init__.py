"""The architectures of the MedSegBenchmarker case study (paper section 4.1, Table 3), one module per model,
in plain PyTorch and sized to the paper's parameter and GMAC figures."""
