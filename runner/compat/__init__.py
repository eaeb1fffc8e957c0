"""Library internals the runner relies on (Hydra, OmegaConf, MLflow, tqdm), each in one module with a test that
names the library version it was written against (tests/test_compat.py)."""
