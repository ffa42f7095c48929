"""Studies: the one pipeline behind ``msb run`` (plan -> search -> cross-validation -> final evaluation, external
sets, fold ensemble -> manifests), resumable and runnable by several workers (``msb run --worker``).

The study-level keys of a study file (``search``, ``cross_validation``, ``final``) are validated by
:mod:`msb.config.study_spec`, with the other config schemas. Modules (import them directly), by phase:

- :mod:`msb.study.pipeline`: :func:`~msb.study.pipeline.run_study`, the one function that runs a study;
- :mod:`msb.study.units`: planning (units, settings check, locks, state);
- :mod:`msb.study.search`: the search phase (grid / Hyperband trials);
- :mod:`msb.study.crossval`: the cross-validation phase; :mod:`msb.study.folds`: fold assignment;
- :mod:`msb.study.evaluate`: evaluation of one run folder on the test split and the external sets;
- :mod:`msb.study.final`: final run, fold ensemble, manifests; :mod:`msb.study.ensemble`: strict majority;
- :mod:`msb.study.external`: external datasets and class mappings; :mod:`msb.study.external_eval`:
  ``msb evaluate --external``;
- :mod:`msb.study.coord`: optuna storage, work claims, heartbeats, retries, file locks (public optuna API);
- :mod:`msb.study.manifest`: JSON state and manifest files.

Nothing outside this package imports it except the CLI and :mod:`msb.cluster` (``msb submit`` / ``msb status``): :mod:`msb.engine` trains and evaluates one run folder.
See ``docs/studies.md`` and ``docs/design.md``.
"""
