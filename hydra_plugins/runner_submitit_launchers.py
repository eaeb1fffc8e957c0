"""The launchers `hydra/launcher=submitit_slurm` and `submitit_local` name. Hydra instantiates only plugin
classes it found in the hydra_plugins package, so the classes are declared here; what they do is
runner.sweeps.submitit_launchers. Without the `slurm` extra (hydra-submitit-launcher) there is nothing to
declare, and `python -m runner` says what to install when such a launcher is asked for."""

import importlib.util

if importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is not None:
    from runner.sweeps.submitit_launchers import SubmititLauncher

    class SlurmLauncher(SubmititLauncher):
        _EXECUTOR = "slurm"

    class LocalLauncher(SubmititLauncher):
        _EXECUTOR = "local"
