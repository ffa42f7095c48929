"""Running a study on a Slurm cluster: ``msb submit`` (:mod:`msb.cluster.slurm`: a generated sbatch script, one job
array of ``msb run --worker`` processes on one optuna RDB storage) and ``msb status``
(:mod:`msb.cluster.status`: the work items of a study by state, read from the storage and the study folder).

The workers are ordinary ``msb run --worker`` processes (:mod:`msb.study.pipeline`); nothing here changes how a
study is run, only where and how its processes are started and watched. See docs/studies.md, "On a Slurm
cluster".
"""
