"""Generic adapters: whole families of published architectures named by config instead of one adapter module
per model (``arch: smp`` for every segmentation-models-pytorch architecture, :mod:`.smp_any`)."""
