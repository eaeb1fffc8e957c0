"""The config's typed schema (runner.config.schema) and the command-line check that composes it before Hydra runs
(runner.config.check)."""
