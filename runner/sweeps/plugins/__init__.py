"""What Hydra calls in a sweep, behind thin classes Hydra imports cheaply (runner.sweeps.callback, hydra_plugins/):
the sweep's start and end (lifecycle), its MLflow parent run (parent_run), the Optuna sweeper on ask/tell
(optuna_sweeper) and the submitit launchers (submitit_launchers). May import every other part of runner.sweeps."""
