"""The components the runner ships, each a `_target_` of a config-group option: datasets
(runner.data.builtin), models, optimizers, learning-rate schedules and losses. A user's own are written
the same way (docs/your-own-experiment.md)."""
