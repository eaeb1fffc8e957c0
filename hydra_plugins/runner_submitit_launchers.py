"""The launchers `hydra/launcher=submitit_slurm` and `submitit_local` name. Hydra instantiates only plugin
classes it found in the hydra_plugins package, so the classes are declared here; what they do is
runner.sweeps.plugins.submitit_launchers, imported only when a sweep launches.

Hydra imports every module under hydra_plugins/ in every Hydra app of the environment, at start-up: this
one imports nothing beyond hydra-submitit-launcher's own launcher module (which Hydra imports anyway), as
Hydra's own plugins do. Without the `slurm` extra there is nothing to declare, and `python -m runner` says
what to install when such a launcher is asked for."""

import importlib.util

if importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is not None:
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import BaseSubmititLauncher

    class _WaitingLauncher(BaseSubmititLauncher):
        """hydra-submitit-launcher's launcher whose sweep waits on its jobs without SLURM's accounting."""

        def launch(self, job_overrides, initial_job_idx):
            from runner.sweeps.plugins.submitit_launchers import launch  # noqa: PLC0415  Hydra imports this module in every Hydra app: the runner only once it is used

            return launch(self, job_overrides, initial_job_idx)

    class SlurmLauncher(_WaitingLauncher):
        _EXECUTOR = "slurm"

    class LocalLauncher(_WaitingLauncher):
        _EXECUTOR = "local"
