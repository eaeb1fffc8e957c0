"""runner: Hydra-configured TensorFlow custom distributed training loops, tracked in MLflow.

Importing the package, or any of its modules, changes nothing in the importing process. What training needs
set before TensorFlow loads (tf_keras, the heap padding) is set by the entry points: runner.entry.
"""
