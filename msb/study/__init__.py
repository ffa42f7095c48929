"""Studies: hyperparameter search (grid / Hyperband), group-aware K-fold cross-validation, fold ensembles and
external test sets, resumable and runnable by several workers (``msb run --worker``).

The study-level keys of a study file (``search``, ``cross_validation``, ``final``) are validated by
:mod:`msb.config.study_spec`, with the other config schemas. Modules (import them directly):

- :mod:`msb.study.folds`: fold assignment (``folds.csv``) and per-fold split files;
- :mod:`msb.study.coord`: optuna storage, work claims, heartbeats, file locks;
- :mod:`msb.study.search`: the search phase (grid / Hyperband trials);
- :mod:`msb.study.external`: external datasets and class mappings;
- :mod:`msb.study.ensemble`: strict-majority fold ensemble from stored predictions;
- :mod:`msb.study.manifest`: study state and manifest files;
- :mod:`msb.study.engine`: the orchestration used by ``msb run`` and ``msb evaluate --external``.

See ``docs/studies.md``.
"""
