"""The words a sweep and its runs share: the tag and file names on the parent and child runs, and what the metric
that chose says of the winner (the objective itself is runner.config.objective's). A leaf: the callback, the sweep
job, the summary and a training job all read it without importing one another."""

from __future__ import annotations

import os

# The sweeper's class, conf/hydra/sweeper/optuna.yaml's _target_ (hydra_plugins/runner_optuna_sweeper.py).
SWEEPER_TARGET = "hydra_plugins.runner_optuna_sweeper.OptunaSweeper"
# Hydra's own Optuna sweeper (hydra-optuna-sweeper), whose configs name it: the runner's takes its keys instead.
HYDRAS_OPTUNA_SWEEPER = "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"
# An Optuna sweep's default storage: Optuna's journal file in the sweep directory; its study's default name.
JOURNAL_FILE = "optuna_study.journal"
DEFAULT_STUDY_NAME = "runner"
PARENT_RUN_ID_FILE = "mlflow_parent_run_id.txt"
# The sweep's MLflow store, absolute (a sqlite file's path is relative to where the sweep started, so
# `python -m runner.report <sweep dir>` run from elsewhere would otherwise open another, empty store).
TRACKING_URI_FILE = "mlflow_tracking_uri.txt"
# Tags on the parent: the command line's overrides, the keys that vary, the sweep directory.
# Tags on each child: its job number and its own overrides (plus MLflow's mlflow.parentRunId), the launcher
# that ran it (basic, joblib, submitit_slurm, submitit_local, ray), under SLURM the SLURM job id, and on Ray the
# node id (ray_node_id, see runner.sweeps.launch.ray_worker).
OVERRIDES_TAG = "overrides"
SWEPT_KEYS_TAG = "swept_keys"
SWEEP_DIR_TAG = "sweep_dir"
JOB_NUMBER_TAG = "job_number"
# Each child's run directory (the job's, or its seed-<seed>/ and fold-<k>/ below it).
RUN_DIR_TAG = "run_dir"
# Each child's configuration (its swept values without `seed`) and seed; on the parent, the configuration
# with the best mean objective.
CONFIGURATION_TAG = "configuration"
SEED_TAG = "seed"
SEED_KEY = "seed"
# Each child's fold with sweep.folds (k of 0..K-1, held out as its validation split); `,fold=k` ends its name.
FOLD_TAG = "fold"
FOLD_KEY = "fold"
BEST_CONFIGURATION_TAG = "best_configuration"
LAUNCHER_TAG = "launcher"
SLURM_JOB_ID_TAG = "slurm_job_id"
WALL_SECONDS = "wall_seconds"
# On the parent: the registered model version the sweep's best job became (`fashion_mnist/3`).
REGISTERED_VERSION_TAG = "registered_model_version"
# On an Optuna sweep's parent run whose terminator ended its study before n_trials: why
# (runner.sweeps.study.terminator).
STOPPED_EARLY_TAG = "study_stopped_early"
# On the parent: the jobs' scores with their directions (MetricTable.as_text) and the task's score a null
# sweep.objective chooses on, so that `python -m runner.report <parent run id>` reads them where the sweep's
# directory (its multirun.yaml) is not.
SCORES_TAG = "scores"
TASK_OBJECTIVE_TAG = "task_objective"
# On the parent of a sweep over several objectives: each with its direction (Objectives.as_text), and, at its end, the
# configurations on the Pareto front ("; " between them); of a sweep with sweep.constraints: the constraints.
OBJECTIVES_TAG = "objectives"
PARETO_FRONT_TAG = "pareto_front"
CONSTRAINTS_TAG = "constraints"


# ---- what chooses the winner (a validation split unless told otherwise) ----
# On each child run and on the parent: the metric that chose (`test_accuracy` where the data could not be split).
CHOSEN_BY_TAG = "chosen_by"


def chosen_on_test(objective: str) -> bool:
    """Whether `objective` is measured on the test set (eval_accuracy is the test set, once more)."""
    return objective.startswith("test_") or objective == "eval_accuracy"


def what_chose(objective: str, asked: bool) -> str:
    """The sentence the summary and the terminal say about what chose the winner. `asked`: the user set
    sweep.objective to it (else the data could not be split)."""
    if chosen_on_test(objective):
        why = (
            f"as sweep.objective={objective} asks"
            if asked
            else "because the data has no validation split (a tf.data dataset the runner cannot split)"
        )
        return (
            f"The test set chose the winner ({objective}), {why}: its test score is optimistic, not an estimate of "
            "how it does on new data. Fix: leave sweep.objective null to choose on a validation split."
        )
    if objective.startswith("val_"):
        return (
            f"The validation split chose the winner ({objective}); the test set was not used to choose, so the "
            "winner's test metrics below are an honest estimate."
        )
    return f"{objective} chose the winner (a training metric); its test metrics are reported beside."


def run_name_for(path: str) -> str:
    """A directory as the user sees it: relative to where the command ran, if it lies below it."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def read_parent_run_id(sweep_dir: str) -> str | None:
    """The id of the sweep's parent run, once the sweep has created it."""
    return _recorded(sweep_dir, PARENT_RUN_ID_FILE)


def _recorded(sweep_dir: str, name: str) -> str | None:
    """What the sweep wrote into its file `name`, or None before it did."""
    path = os.path.join(sweep_dir, name)
    if not os.path.exists(path):
        return None
    with open(path) as handle:
        return handle.read().strip() or None


def record_tracking_uri(sweep_dir: str, tracking_uri: str) -> None:
    """Write the sweep's store into its directory, a sqlite file's path made absolute from the current directory
    (where the sweep started)."""
    from runner.tracking.store import absolute_tracking_uri  # noqa: PLC0415  MLflow: only where a sweep starts

    with open(os.path.join(sweep_dir, TRACKING_URI_FILE), "w") as handle:
        handle.write(absolute_tracking_uri(tracking_uri) + "\n")


def read_tracking_uri(sweep_dir: str) -> str | None:
    """The store the sweep recorded when it started; None for a sweep that recorded none."""
    return _recorded(sweep_dir, TRACKING_URI_FILE)
