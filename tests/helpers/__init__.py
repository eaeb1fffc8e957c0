"""Plain functions and run presets the tests share; fixtures and pytest hooks live in tests/conftest.py.

A test imports what it uses from the module that holds it (tests/ is on sys.path, as pytest puts it there):

    from helpers.presets import TINY, WITH_MODEL              # named run overrides, each documented once
    from helpers.config import REPO, compose, mlflow_settings  # real Hydra composition of conf/
    from helpers.cli import run_cli, start_cli                 # `python -m runner ...` in a fresh process
    from helpers.waiting import wait_for                       # poll a condition with a deadline (never sleep)
    from helpers.tracking import metric_history, mlflow_client
    from helpers.sweeps import children, parent_id_of, sweep   # `python -m runner -m ...` and its runs
    from helpers.data import write_fashion_mnist, write_tfrecords  # IDX, TFRecord, .npz, image folders, tf.data
    from helpers.requires import requires                      # @requires("postgresql"): skip (fail under CI=true)
    from helpers.processes import stop_group                   # process groups, children, waiting
    from helpers.servers import MlflowServer, Postgres, free_port
    from helpers.browser import Chromium
    from helpers.slurm import running_slurm, submit, job_output  # a real SLURM and the shipped sbatch scripts
    from helpers.preemption import Task, chief_stop, assert_worker_words  # preempted cluster tasks and their words

No test module imports another test module or conftest.py.
"""
