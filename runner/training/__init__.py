"""Training: the tutorial's strategy, data, model, replica steps, loop styles, controller and checkpoints.

Imports TensorFlow; never imports runner.tracking or runner.sweeps (results leave through the
controller's listeners, which runner.train wires to a tracker)."""
