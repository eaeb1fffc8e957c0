"""runner: Hydra-configured TensorFlow custom distributed training loops, tracked in MLflow.

Importing the package selects Keras 2 (tf_keras) for everything that goes through ``tf.keras``:
Keras 3 loses updates under ParameterServerStrategy and miscounts metrics under
CentralStorageStrategy, while the tutorial's custom loop runs as written on tf_keras. It also
keeps glibc from handing TensorFlow's freed scratch memory back to the kernel (runner.heap).
"""

import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from runner.heap import keep_freed_memory  # noqa: E402

keep_freed_memory()  # before TensorFlow starts its threads: see runner/heap.py
