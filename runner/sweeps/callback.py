"""The sweep's Hydra Callback, configured in conf/config.yaml (`hydra.callbacks.sweep`).

Hydra instantiates callbacks for single runs too, so this module imports nothing beyond Hydra's Callback: a single
run, or a single run's config error, pays for no sweep code. What a sweep's start and end do is
runner.sweeps.plugins.lifecycle, imported once a multirun starts (as hydra_plugins/ does for the sweeper)."""

from typing import Any

from hydra.experimental.callback import Callback


class SweepCallback(Callback):
    """Checks a sweep and creates (or reuses) its MLflow parent run before the jobs; summarizes, registers and
    closes it after."""

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        from runner.sweeps.plugins.lifecycle import start_sweep  # noqa: PLC0415  the sweep's code: only for a multirun

        start_sweep(config)

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        from runner.sweeps.plugins.lifecycle import end_sweep  # noqa: PLC0415  the sweep's code: only for a multirun

        end_sweep(config)
