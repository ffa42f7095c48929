"""ImageNet encoder weights (``model.encoder_weights: imagenet``) through timm's and smp's own hub cache.

timm 1.0 and segmentation-models-pytorch 0.6 both download pretrained weights with
``huggingface_hub.hf_hub_download`` into the Hugging Face cache (``$HF_HOME/hub``, default
``~/.cache/huggingface/hub``; ``HF_HUB_CACHE`` overrides it). Neither uses ``TORCH_HOME`` for these encoders.
:func:`imagenet_files` says which files an architecture needs; :func:`fetch` downloads them into a cache folder
(``msb weights fetch``) for compute nodes without internet, which then set ``HF_HOME`` to that folder (and
``HF_HUB_OFFLINE=1``). Loading (:func:`pretrained_guard`) turns a file that is neither in the cache nor
downloadable into one line naming the file and ``msb weights fetch``.

The SHA-256 of a file is the one the Hub publishes (the ETag of a Git-LFS file, read by :func:`fetch`), checked
against the downloaded bytes; without network it is unknown (``msb weights list`` then shows the cached file's
digest, or ``-``).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from msb.errors import MSBError

__all__ = ["WeightFile", "imagenet_files", "pretrained_guard", "fetch", "cache_dir", "cached_path", "IMAGENET"]

#: the value of ``model.encoder_weights`` that asks for the library's ImageNet weights
IMAGENET = "imagenet"

#: timm model -> its pretrained tag (timm's default ``pretrained_cfg`` for these names)
_TIMM = {"res2net50_v1b": "timm/res2net50d.in1k", "pvt_v2_b2": "timm/pvt_v2_b2.in1k"}
_TIMM["convnext_small"] = "timm/convnext_small.fb_in1k"  # VWFormer's ConvNeXt-S (Facebook's ImageNet-1k weights)
_ARCH_BACKBONE = {"pranet": "res2net50_v1b", "sanet": "res2net50_v1b", "polyp_pvt": "pvt_v2_b2",
                  "pvt_cascade": "pvt_v2_b2", "g_cascade": "pvt_v2_b2"}
_SMP_DEFAULT = {"unet": "resnet34", "segformer": "mit_b2",
                "smp": "resnet34"}  # arch smp (msb.models.generic.smp_any): model.encoder, else smp's default
_ARCH_BACKBONE["vwformer_convnext_s"] = "convnext_small"
_TIMM["pvt_v2_b3"] = "timm/pvt_v2_b3.in1k"
_ARCH_BACKBONE["cenet_pvt_b3"] = "pvt_v2_b3"
_SMP_DEFAULT.update({"segformer_b3": "mit_b3", "vwformer_mit_b3": "mit_b3"})


@dataclass(frozen=True)
class WeightFile:
    """One file of ImageNet weights: Hub ``repo_id``, ``revision`` (None = main), ``filename``, the library that
    loads it (``timm`` or ``smp``) and the encoder name."""

    repo_id: str
    revision: Optional[str]
    filename: str
    library: str
    encoder: str


def imagenet_files(arch: str, encoder: Optional[str] = None) -> list[WeightFile]:
    """The files ``encoder_weights: imagenet`` needs for ``arch`` (a registry name or a backbone name of
    :data:`msb.models.backbones.BACKBONES`; ``encoder`` = ``model.encoder`` for the smp models).

    Sources: timm's ``pretrained_cfg`` (``hf_hub_id``; timm loads ``model.safetensors``) for the polyp adapters'
    backbones, smp's ``encoders[name]["pretrained_settings"]["imagenet"]`` (``repo_id``, pinned ``revision``;
    smp loads ``config.json`` and ``model.safetensors``) for U-Net and SegFormer.

    Raises:
        MSBError: the architecture or encoder has no ImageNet weights known to timm/smp.
    """
    if arch in _ARCH_BACKBONE or arch in _TIMM:
        bb = _ARCH_BACKBONE.get(arch, arch)
        return [WeightFile(_TIMM[bb], None, "model.safetensors", "timm", bb)]
    if arch == "timm_uper":  # any timm backbone: its default pretrained tag (msb.models.generic.timm_uper)
        return [_timm_default_file(encoder or "convnext_tiny")]
    if arch in _SMP_DEFAULT:
        from segmentation_models_pytorch.encoders import encoders

        name = encoder or _SMP_DEFAULT[arch]
        settings = encoders.get(name, {}).get("pretrained_settings", {}).get(IMAGENET)
        if settings is None:
            raise MSBError(f"model.encoder_weights: imagenet: smp has no ImageNet weights for encoder '{name}'; "
                           f"use a local file (encoder_weights: PATH) or none")
        return [WeightFile(settings["repo_id"], settings.get("revision"), f, "smp", name)
                for f in ("config.json", "model.safetensors")]
    known = ", ".join(sorted([*_ARCH_BACKBONE, *_SMP_DEFAULT]))
    raise MSBError(f"model.encoder_weights: imagenet is known for {known}, not '{arch}'; use a local file "
                   f"(encoder_weights: PATH) or none")


def _timm_default_file(name: str) -> WeightFile:
    """The hub file of timm model ``name``'s default pretrained tag. Raises MSBError when it has none."""
    import timm

    cfg = timm.models.get_pretrained_cfg(name) if timm.is_model(name) else None
    if cfg is None or not getattr(cfg, "hf_hub_id", None):
        raise MSBError(f"model.encoder_weights: imagenet: timm has no hub weights for '{name}'; use a local file "
                       f"(encoder_weights: PATH) or none")
    return WeightFile(cfg.hf_hub_id, None, "model.safetensors", "timm", name)


def cache_dir() -> Path:
    """The Hugging Face hub cache in use (``huggingface_hub.constants.HF_HUB_CACHE``: ``$HF_HUB_CACHE`` or
    ``$HF_HOME/hub``)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def cached_path(f: WeightFile, cache: Optional[Path] = None) -> Optional[Path]:
    """Path of ``f`` in the hub cache (``cache`` or :func:`cache_dir`), or None when it is not there."""
    from huggingface_hub import try_to_load_from_cache

    p = try_to_load_from_cache(f.repo_id, f.filename, cache_dir=str(cache or cache_dir()), revision=f.revision)
    return Path(p) if isinstance(p, str) else None


@contextlib.contextmanager
def pretrained_guard(arch: str, encoder: Optional[str] = None) -> Iterator[None]:
    """Run the library's pretrained download/load inside; a hub or network failure becomes one line.

    Raises:
        MSBError: ``<repo>/<file>`` is neither in the cache (named) nor downloadable; the message says to run
            ``msb weights fetch <arch> --to DIR`` where there is network and set ``HF_HOME=DIR`` here.
    """
    from huggingface_hub.errors import HfHubHTTPError

    try:
        yield
    except (OSError, HfHubHTTPError, ValueError) as exc:
        if isinstance(exc, ValueError) and "offline" not in str(exc).lower():
            raise
        files = imagenet_files(arch, encoder)
        need = ", ".join(f"{f.repo_id}/{f.filename}" + (f"@{f.revision[:8]}" if f.revision else "") for f in files)
        offline = " (HF_HUB_OFFLINE=1)" if os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0") else ""
        raise MSBError(f"model.encoder_weights: imagenet: {need} is not in the hub cache {cache_dir()} and cannot "
                       f"be downloaded{offline} ({type(exc).__name__}); run `msb weights fetch {arch} --to DIR` "
                       f"on a machine with network, then set HF_HOME=DIR here, or give a local file") from exc


def fetch(arch: str, encoder: Optional[str], to: Path) -> list[tuple[WeightFile, Path, str, Optional[str]]]:
    """Download the ImageNet files of ``arch`` into the hub cache layout under ``to/hub`` (``HF_HOME=to``).

    Returns:
        For each file: (file, local path, SHA-256 of its bytes, SHA-256 published by the Hub or None).

    Raises:
        MSBError: a download fails (offline, unknown repo) or the bytes differ from the published SHA-256.
    """
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
    from huggingface_hub.errors import HfHubHTTPError

    from msb.utils.hashing import sha256_file

    out = []
    for f in imagenet_files(arch, encoder):
        try:
            path = Path(hf_hub_download(f.repo_id, f.filename, revision=f.revision, cache_dir=str(to / "hub")))
            published = None
            with contextlib.suppress(OSError, HfHubHTTPError, ValueError):
                meta = get_hf_file_metadata(hf_hub_url(f.repo_id, f.filename, revision=f.revision))
                etag = (meta.etag or "").strip('"')
                published = etag if len(etag) == 64 else None  # an LFS file's ETag is its SHA-256
        except (OSError, HfHubHTTPError, ValueError) as exc:
            raise MSBError(f"{f.repo_id}/{f.filename}: download failed ({type(exc).__name__}: "
                           f"{str(exc).splitlines()[0][:160]}); check the network or HF_ENDPOINT") from exc
        digest = sha256_file(path)
        if published is not None and digest != published:
            raise MSBError(f"{path}: SHA-256 {digest[:12]}... differs from the published {published[:12]}...; "
                           f"delete it and fetch again")
        out.append((f, path, digest, published))
    return out
