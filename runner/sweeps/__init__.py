"""Sweeps (`python -m runner -m ...`): the Hydra callback owning the parent run, each job in its own
training process, and the summary read back from MLflow. Never imports TensorFlow."""
