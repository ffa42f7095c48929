"""Generic adapters: whole families of architectures named by configuration instead of one adapter module per
fixed network.

- :mod:`msb.models.generic.smp_any`: ``arch: smp``, every segmentation-models-pytorch architecture with any of its
  encoders.
- :mod:`msb.models.generic.uper`: the UPerNet decoder head (pyramid pooling + feature pyramid), shared by the
  generic ``timm_uper`` adapter and the paper's TransNeXt/InternImage models.
- :mod:`msb.models.generic.timm_uper`: ``arch: timm_uper``, any timm ``features_only`` backbone + UPerNet head.
"""
