"""Sweeps (`python -m runner -m ...`), by concern, each layer importing only those below it (lint-imports holds
them there: pyproject.toml's [tool.importlinter]):

- `callback`: the sweep's Hydra Callback, a shim Hydra imports in every run; it reaches `plugins` once a multirun
  starts.
- `plugins/`: the bodies of what Hydra calls in a sweep: its start and end (lifecycle), the parent run, the Optuna
  sweeper, the submitit launchers.
- `job/`: one job of a sweep: its child runs, the training of its seeds and folds, the champion's model.
- `launch/`: where a job's runs train: the launchers' descriptors and checks, Ray's side, the warm workers.
- `report/`: what a sweep's end writes: the summary, its statistics per configuration, the HTML report, the
  `python -m runner.report` command.
- `study/`: the Optuna study a sweep asks and tells: its storage, the grid's study, pruning, the terminator.
- `sweep_config`: a sweep's composed config read once, typed; `terms`, `uncertainty` and `pareto`: the names a sweep
  and its runs share, the statistics of a configuration's replicates, and the Pareto front of several objectives.
"""
