"""Training: the tutorial's strategy, data, model, replica steps, loop styles, controller and checkpoints, and the
job's Trainer built from them (build.py) and run (trainer.py).

Imports TensorFlow; never imports runner.sweeps (results leave through the controller's listeners: the run's
tracker, runner.tracking.protocol, and the caller's), and imports MLflow only inside the functions that need it."""
