"""The Optuna study a sweep asks and tells: its storage, name and search space (study), the study a pruned grid's
jobs report to (grid_study), pruning (pruning) and the regret terminator (terminator). May import
runner.sweeps.sweep_config, .terms and .uncertainty only."""
