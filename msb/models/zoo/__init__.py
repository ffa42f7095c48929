"""The architecture adapters: one module per wrapped network family (U-Net, PraNet, Polyp-PVT, SANet, PVT-CASCADE,
G-CASCADE, SegFormer) and their shared building blocks (``blocks``, ``graph``).

Each adapter registers itself with :func:`msb.models.registry.register` when imported; the registry imports
them lazily. Adapters may import ``msb.models.base``, ``backbones``, ``pretrained`` and each other's blocks;
nothing in ``msb.models`` outside this folder imports an adapter except the registry's lazy loader and
``released`` (official weights' key maps).
"""
