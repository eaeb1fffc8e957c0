"""The sweeper `hparams_search=optuna` selects (conf/hydra/sweeper/optuna.yaml). Hydra instantiates only plugin
classes it found in the hydra_plugins package, so the class is declared here; what it does is
runner.sweeps.plugins.optuna_sweeper, imported only when a sweep starts.

Hydra imports every module under hydra_plugins/ in every Hydra app of the environment, at start-up: this one
imports nothing beyond Hydra's own Sweeper interface."""

from typing import Any

from hydra.plugins.sweeper import Sweeper


class OptunaSweeper(Sweeper):
    """Optuna's ask/tell over Hydra's launcher: each trial one job, launched as soon as a slot frees."""

    def __init__(self, **settings: Any) -> None:
        self.settings = settings  # conf/hydra/sweeper/optuna.yaml, read again from the config's hydra.sweeper (typed)
        self.config: Any = None
        self.launcher: Any = None

    def setup(self, *, hydra_context: Any, task_function: Any, config: Any) -> None:
        from hydra.core.plugins import Plugins  # noqa: PLC0415  Hydra's plugin registry: only once a sweep sets up

        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> Any:
        from runner.sweeps.plugins.optuna_sweeper import sweep  # noqa: PLC0415  Hydra imports this module in every Hydra app: the runner only once it is used

        return sweep(self, arguments)
