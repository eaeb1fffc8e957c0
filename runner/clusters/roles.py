"""This process's place in a multi-process TensorFlow cluster (cluster=tf_config or cluster=slurm): its task,
from TF_CONFIG (checked against the strategy before TensorFlow loads) or from the SLURM job step.

A task that only serves runs runner.clusters.serving; the chief tells the servers the job's end with
runner.clusters.end_of_job.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from runner.config.schema import Settings
from runner.errors import RunnerError
from runner.strategy_kinds import strategy_kind

TF_CONFIG = "TF_CONFIG"


@dataclass(frozen=True)
class Task:
    """One process of the job. `chief` trains with side effects: the MLflow run, the checkpoints that
    are kept, the final evaluation; in a single process that is the only process."""

    type: str | None = None  # chief | worker | ps; None in a single process
    index: int = 0
    chief: bool = True
    resolver: Any = None  # tf.distribute.cluster_resolver.ClusterResolver, None in a single process

    @property
    def name(self) -> str:
        return f"{self.type} {self.index}" if self.type else "the only process"


SINGLE_PROCESS = Task()


def is_chief(cluster: Mapping[str, list], task_type: str, index: int) -> bool:
    # TensorFlow's convention: the chief task, or worker 0 when the cluster has no chief.
    return task_type == "chief" or (task_type == "worker" and index == 0 and not cluster.get("chief"))


def tracks_the_run(settings: Settings, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this process will be the job's chief, the one task that tracks its MLflow run, known before
    TensorFlow loads: from TF_CONFIG, or the SLURM task's rank (SlurmClusterResolver hands out the tasks by
    rank in the order of the jobs' sorted names, so rank 0 is the chief, or worker 0 without one). A bad TF_CONFIG
    says no here; resolve() then says what is wrong with it."""
    kind = settings.cluster.kind
    if kind == "none":
        return True
    if kind == "tf_config":
        try:
            config = read_tf_config(environ.get(TF_CONFIG), settings.strategy.name)
        except RunnerError:
            return False
        task = config["task"]
        return is_chief(config["cluster"], task["type"], task.get("index", 0))
    return kind == "slurm" and environ.get("SLURM_PROCID", "0") == "0"


def read_tf_config(text: str | None, strategy: str) -> dict:
    """Parse and check TF_CONFIG without TensorFlow: a bad one fails in a second with the fix."""
    example = strategy_kind(strategy).tf_config_example
    if not text:
        raise RunnerError(
            f"cluster=tf_config reads the cluster and this task from the {TF_CONFIG} environment variable, which "
            f"is not set. Fix: set it in every task, e.g. {TF_CONFIG}='{example}', or use cluster=local to start "
            "a cluster on this machine."
        )
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise RunnerError(
            f"{TF_CONFIG} is not valid JSON ({error.msg} at character {error.pos}): {json.dumps(text[:200])}. "
            f"Fix: set it to a JSON object such as {example}."
        ) from None
    task = config.get("task") if isinstance(config, dict) else None
    if not isinstance(config, dict) or not isinstance(config.get("cluster"), dict) or not isinstance(task, dict):
        raise RunnerError(
            f'{TF_CONFIG}={json.dumps(config)[:200]} is not valid: it needs a "cluster" object (job name to '
            f'list of host:port) and a "task" object (this process\'s type and index). Fix: set it as in {example}.'
        )
    index = task.get("index", 0)
    if not isinstance(task.get("type"), str) or isinstance(index, bool) or not isinstance(index, int):
        raise RunnerError(
            f'{TF_CONFIG}\'s task {json.dumps(task)} is not valid: it needs a "type" (chief, worker or ps) and '
            f'an integer "index". Fix: set it as in {example}.'
        )
    check_cluster(config["cluster"], task["type"], index, strategy, TF_CONFIG)
    return config


def check_cluster(cluster: Mapping[str, Any], task_type: str, index: int, strategy: str, source: str) -> None:
    """Refuse a cluster the strategy cannot run on, naming what is wrong and the fix."""
    allowed = strategy_kind(strategy).cluster_jobs
    shape = json.dumps(cluster)[:300]
    for job, addresses in cluster.items():
        if job not in allowed:
            raise RunnerError(
                f"{source}'s cluster {shape} is not valid for strategy={strategy}: it has a {job!r} job, and this "
                f"strategy's cluster holds only {', '.join(allowed)} tasks. Fix: drop the {job!r} job"
                + (", or use strategy=parameter_server" if job == "ps" else "")
                + "."
            )
        if (
            not isinstance(addresses, list)
            or not addresses
            or not all(isinstance(a, str) and a.rpartition(":")[2].isdigit() for a in addresses)
        ):
            raise RunnerError(
                f"{source}'s cluster {shape} is not valid: its {job!r} job must be a non-empty list of "
                f'"host:port" addresses. Fix: list one address per task, e.g. "{job}": ["host0:12345"].'
            )
    if len(cluster.get("chief", [])) > 1:
        raise RunnerError(
            f"{source}'s cluster {shape} is not valid: it has {len(cluster['chief'])} chief tasks. Fix: keep one "
            "chief (the task that logs to MLflow and keeps the checkpoints) and make the others workers."
        )
    if strategy_kind(strategy).coordinated:
        for job, role in (
            ("chief", "the coordinator, which runs the training loop"),
            ("worker", "the tasks that run the training steps"),
            ("ps", "the parameter servers"),
        ):
            if not cluster.get(job):
                raise RunnerError(
                    f"{source}'s cluster {shape} has no {job} task: strategy=parameter_server needs {role}. "
                    f'Fix: add a "{job}" job to the cluster and start one more process as that task, as in '
                    f"{strategy_kind(strategy).tf_config_example}."
                )
    elif not cluster.get("chief") and not cluster.get("worker"):
        raise RunnerError(
            f"{source}'s cluster {shape} has no chief and no worker 0 to run the training loop and log to "
            f"MLflow. Fix: list the workers, e.g. {strategy_kind(strategy).tf_config_example}."
        )
    if task_type not in cluster or not 0 <= index < len(cluster[task_type]):
        raise RunnerError(
            f"{source} says this process is task {task_type!r} {index}, which its cluster {shape} does not "
            f"have. Fix: give each process a task type among {', '.join(cluster)} and an index below that "
            "job's number of addresses."
        )


def resolve(settings: Settings) -> Task:
    """This process's task, from TF_CONFIG or the SLURM job step (SINGLE_PROCESS for cluster=none)."""
    kind, strategy = settings.cluster.kind, settings.strategy.name
    if kind == "none":
        _check_single_task(strategy)
        return SINGLE_PROCESS
    if kind == "tf_config":
        config = read_tf_config(os.environ.get(TF_CONFIG), strategy)
        import tensorflow as tf  # noqa: PLC0415  TensorFlow: after the config is checked without it

        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        cluster, task_type, index = config["cluster"], config["task"]["type"], config["task"].get("index", 0)
    elif kind == "slurm":
        resolver = _slurm_resolver(settings)
        cluster, task_type, index = resolver.cluster_spec().as_dict(), resolver.task_type, resolver.task_id
        check_cluster(cluster, task_type, index, strategy, "the SLURM job step")
    else:
        raise ValueError(f"cluster.kind={kind!r} has no task of its own (cluster=local launches tasks)")
    return Task(task_type, index, is_chief(cluster, task_type, index), resolver)


def _check_single_task(strategy: str) -> None:
    """A one-process strategy started as several tasks of a SLURM job step would train the same job
    several times over, into one run directory."""
    tasks = os.environ.get("SLURM_STEP_NUM_TASKS", "1")
    if tasks.isdigit() and int(tasks) > 1 and "SLURM_PROCID" in os.environ:
        raise RunnerError(
            f"this SLURM job step runs {tasks} tasks, but strategy={strategy} with cluster=none trains in one "
            f"process, so every task would train the same job on its own into the same run directory. Fix: start "
            f"one task (srun --ntasks=1, #SBATCH --ntasks=1, hydra.launcher.tasks_per_node=1), or train on all of "
            f"them with strategy=multi_worker_mirrored cluster=slurm (see slurm/train_multi_worker.sbatch)."
        )


def _slurm_resolver(settings: Settings):
    """SlurmClusterResolver over the job step's tasks: all workers for multi_worker_mirrored; for
    parameter_server a chief, cluster.ps parameter servers, and the remaining tasks as workers."""
    import tensorflow as tf  # noqa: PLC0415  TensorFlow: after the config is checked without it

    try:
        tasks = int(os.environ["SLURM_STEP_NUM_TASKS"])
        ps = settings.cluster.ps
        if strategy_kind(settings.strategy.name).coordinated:
            if tasks < ps + 2:
                raise RunnerError(
                    f"cluster.ps={ps} is not valid for this SLURM job step of {tasks} task(s): parameter_server "
                    f"needs a chief, {ps} parameter server(s) and at least one worker. Fix: start at least "
                    f"{ps + 2} tasks (srun --ntasks), or lower cluster.ps."
                )
            jobs = {"chief": 1, "ps": ps, "worker": tasks - 1 - ps}
        else:
            jobs = {"worker": tasks}
        # TensorFlow's resolver counts GPUs with nvidia-smi, and raises FileNotFoundError where it is missing.
        if shutil.which("nvidia-smi") is not None:
            return tf.distribute.cluster_resolver.SlurmClusterResolver(jobs=jobs, port_base=settings.cluster.port_base)
        # On CPU-only nodes TensorFlow's resolver needs nvidia-smi to count GPUs, and with 0 GPUs per task it
        # hands out no addresses: resolve with one placeholder "GPU" per task, and pass on the cluster alone.
        slurm = tf.distribute.cluster_resolver.SlurmClusterResolver(
            jobs=jobs, port_base=settings.cluster.port_base, gpus_per_node=tasks, gpus_per_task=1, auto_set_gpu=False
        )
        spec = slurm.cluster_spec()
        return tf.distribute.cluster_resolver.SimpleClusterResolver(
            spec, task_type=slurm.task_type, task_id=slurm.task_id, rpc_layer="grpc", num_accelerators={}
        )
    except (KeyError, ValueError, RuntimeError, OSError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise RunnerError(
            f"cluster=slurm could not read the SLURM job step ({reason}). Fix: start every task with srun inside "
            "an sbatch or salloc allocation (see docs/clusters.md, SLURM: training), or use cluster=local on one "
            "machine or cluster=tf_config with TF_CONFIG."
        ) from None
