"""Dataset converters: raw download folder -> prepared dataset (``index.csv`` + ``classes.csv`` + files).

Registry :data:`CONVERTERS` maps a converter name to a callable ``f(source, out, **options) ->
ConversionReport``. :func:`prepare_dataset` is the entry point used by ``msb data prepare NAME --source DIR``.

Every preparation through :func:`prepare_dataset` writes ``prepare.json`` beside ``index.csv`` (converter,
options, source file-list digest, threshold, groups file, changed mask pixels per file, msb version;
:mod:`.provenance`).

All converters build the dataset in a hidden temporary folder beside ``out`` (see :func:`staged_output`) and
rename it onto ``out`` only after the result has been validated with
:func:`msb.data.schema.load_prepared_dataset`; on any error the temporary folder is deleted, so no partial
dataset is ever left behind. An existing non-empty ``out`` is only replaced with ``overwrite=True``.

Registered names: ``kvasir-seg`` (:mod:`.kvasir_seg`), ``folder`` (:mod:`.folder`), ``synthetic``
(:func:`msb.data.synth.make_synthetic_dataset`, ``source`` ignored), ``synthetic-pranet`` (a tiny generated
PraNet-layout collection through the ``pranet`` converter, :mod:`msb.data.synth_pranet`), ``pranet`` (:mod:`.pranet`),
``cvc-clinicdb`` (:mod:`.cvc_clinicdb`), ``isic2018-task1`` (:mod:`.isic2018`), ``busi`` (:mod:`.busi`),
``bkai-igh-neopolyp`` (:mod:`.bkai_neopolyp`), ``cvc-colondb``, ``etis-larib``, ``cvc-300``
(:mod:`.polyp_sets`), ``bcss`` (:mod:`.bcss`), ``camus`` (:mod:`.camus`), ``synthetic-multiclass``
(:mod:`msb.data.synth_multiclass`, ``source`` ignored), ``merge`` (prepared datasets -> one multi-source dataset,
:mod:`.merge`; ``source`` ignored); source layouts each converter accepts: :mod:`.layouts`; a URL or archive as
source: :mod:`.fetch`. Names are case-insensitive and ``_`` is accepted for ``-``.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any, Callable

from msb.data.converters.provenance import recording
from msb.data.converters.staging import ConversionReport, staged_output  # re-exported
from msb.errors import MSBError


def _synthetic(source: str | os.PathLike | None, out: str | os.PathLike, **options: Any) -> ConversionReport:
    """Converter wrapper for :func:`msb.data.synth.make_synthetic_dataset` (``source`` is ignored)."""
    from msb.data.synth import make_synthetic_dataset

    return make_synthetic_dataset(out, **options)


def _synthetic_pranet(source: str | os.PathLike | None, out: str | os.PathLike, **options: Any) -> ConversionReport:
    """Converter wrapper for :func:`msb.data.synth_pranet.convert_synthetic_pranet` (``source`` is ignored)."""
    from msb.data.synth_pranet import convert_synthetic_pranet

    return convert_synthetic_pranet(source, out, **options)


def _synthetic_multiclass(source: str | os.PathLike | None, out: str | os.PathLike, **options: Any
                          ) -> ConversionReport:
    """Converter wrapper for :func:`msb.data.synth_multiclass.make_multiclass_synthetic` (``source`` ignored)."""
    from msb.data.synth_multiclass import make_multiclass_synthetic

    return make_multiclass_synthetic(out, **options)


def _merge(source: str | os.PathLike | None, out: str | os.PathLike, **options: Any) -> ConversionReport:
    """Converter wrapper for :func:`msb.data.converters.merge.convert_merge` (parts prepared by
    :func:`prepare_dataset`)."""
    return convert_merge(source, out, prepare=prepare_dataset, **options)


def _normalise(name: str) -> str:
    return str(name).strip().lower().replace("_", "-")


def _options_of(fn: Callable[..., Any]) -> list[str]:
    return list(_option_defaults(fn))


def _option_defaults(fn: Callable[..., Any]) -> dict[str, Any]:
    """Option name -> default value (``inspect.Parameter.empty`` when it has none) of a converter."""
    if fn is _synthetic:
        from msb.data.synth import make_synthetic_dataset

        fn = make_synthetic_dataset
        skip = {"out"}
    elif fn is _synthetic_pranet:
        from msb.data.synth_pranet import convert_synthetic_pranet

        fn = convert_synthetic_pranet
        skip = {"source", "out"}
    elif fn is _synthetic_multiclass:
        from msb.data.synth_multiclass import make_multiclass_synthetic

        fn, skip = make_multiclass_synthetic, {"out"}
    elif fn is _merge:
        fn, skip = convert_merge, {"source", "out", "prepare"}
    else:
        skip = {"source", "out"}
    sig = inspect.signature(fn)
    return {p: v.default for p, v in sig.parameters.items()
            if p not in skip and v.kind in (v.KEYWORD_ONLY, v.POSITIONAL_OR_KEYWORD)}


def prepare_dataset(name: str, source: str | os.PathLike | None, out: str | os.PathLike, **options: Any
                    ) -> ConversionReport:
    """Run the converter ``name`` on ``source``, writing a prepared dataset to ``out``.

    Args:
        name: a key of :data:`CONVERTERS` (case-insensitive, ``_`` = ``-``).
        source: the raw dataset folder (ignored by ``synthetic``).
        out: destination folder (convention: ``datasets/<name>``).
        **options: converter options (e.g. ``limit=5``, ``overwrite=True``, ``mask_suffix="_mask"``).

    Returns:
        The :class:`ConversionReport`.

    Raises:
        MSBError: unknown converter name (listing the valid names), unknown option (listing the valid ones),
            missing source, or any error of the converter.
    """
    key = _normalise(name)
    if key not in CONVERTERS:
        raise MSBError(f"unknown dataset converter {name!r}; valid names: {', '.join(sorted(CONVERTERS))}.")
    fn = CONVERTERS[key]
    defaults = _option_defaults(fn)
    valid = list(defaults)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise MSBError(f"unknown option(s) {unknown} for converter {key!r}; valid options: {', '.join(valid)}.")
    if key not in ("synthetic", "synthetic-pranet", "synthetic-multiclass", "merge") and source is None:
        raise MSBError(f"converter {key!r} needs a source folder (--source DIR).")
    effective = {k: v for k, v in defaults.items() if v is not inspect.Parameter.empty}
    effective.update(options)
    with recording(key, source if key not in ("synthetic", "merge") else None, effective):  # -> prepare.json
        return fn(source, out, **options)


from msb.data.converters.folder import convert_folder  # noqa: E402
from msb.data.converters.kvasir_seg import convert_kvasir_seg  # noqa: E402
from msb.data.converters.bkai_neopolyp import convert_bkai_neopolyp  # noqa: E402
from msb.data.converters.bcss import convert_bcss  # noqa: E402
from msb.data.converters.busi import convert_busi  # noqa: E402
from msb.data.converters.cvc_clinicdb import convert_cvc_clinicdb  # noqa: E402
from msb.data.converters.isic2018 import convert_isic2018_task1  # noqa: E402
from msb.data.converters.pranet import convert_pranet  # noqa: E402
from msb.data.converters.polyp_sets import convert_cvc_300, convert_cvc_colondb, convert_etis_larib  # noqa: E402
from msb.data.converters.merge import convert_merge  # noqa: E402
from msb.data.converters.camus import convert_camus  # noqa: E402

#: converter name -> callable(source, out, **options) -> ConversionReport
CONVERTERS: dict[str, Callable[..., ConversionReport]] = {
    "kvasir-seg": convert_kvasir_seg,
    "folder": convert_folder,
    "synthetic": _synthetic,
    "synthetic-pranet": _synthetic_pranet,
    "pranet": convert_pranet,
    "cvc-clinicdb": convert_cvc_clinicdb,
    "isic2018-task1": convert_isic2018_task1,
    "busi": convert_busi,
    "bkai-igh-neopolyp": convert_bkai_neopolyp,
    "cvc-colondb": convert_cvc_colondb,
    "etis-larib": convert_etis_larib,
    "cvc-300": convert_cvc_300,
    "bcss": convert_bcss,
    "merge": _merge,
    "camus": convert_camus,
    "synthetic-multiclass": _synthetic_multiclass,
}

__all__ = ["CONVERTERS", "ConversionReport", "prepare_dataset", "staged_output", "convert_folder",
           "convert_kvasir_seg"]
