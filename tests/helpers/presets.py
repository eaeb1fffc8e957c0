"""Named run presets: the overrides of `python -m runner` a test starts from, each defined and documented
here once. Later overrides win, so a test adds what it checks after a preset (`[*TINY, "epochs=3"]`)."""

# Small, learnable, fast: a few dozen steps per epoch on synthetic data, one epoch, no progress bar.
# Logging the trained model takes seconds per run; the tests that check it add WITH_MODEL.
TINY = [
    "dataset=synthetic",
    "dataset.train_examples=512",
    "dataset.test_examples=256",
    "epochs=1",
    "progress=false",
    "mlflow.log_model=false",
]
# After a preset: log the trained model as MLflow Model (the schema's default).
WITH_MODEL = "mlflow.log_model=true"

# TINY for two epochs: a second epoch to compare, resume into, or stop in.
TWO_EPOCHS = [*TINY, "epochs=2"]

# Two epochs of 1,024 examples, seed 7: losses that move enough between epochs to compare runs.
SMALL = [*TINY, "dataset.train_examples=1024", "epochs=2", "seed=7"]

# Half of TINY on one device: a job of a sweep that trains several (about ten seconds each), or a quick
# run of an installed wheel. No MLflow Model: the registry's own tests cover what a sweep does with them.
SWEEP_JOB = [
    "dataset=synthetic",
    "dataset.train_examples=256",
    "dataset.test_examples=128",
    "epochs=1",
    # Spelled as Hydra writes a sweep job's overrides back into its `overrides` tag (False, not false), so that
    # the tests can compare that tag with the command line.
    "progress=False",
    "strategy=one_device",
    "mlflow.log_model=False",
    # Choose on the test set, as these tests were written for (a sweep's default, val_accuracy on a validation
    # split the jobs hold out, has its own tests: tests/test_sweep_validation.py).
    "sweep.objective=test_accuracy",
]
