"""`python -m runner [overrides]` (or the `runner` script): compose the config with Hydra, validate it, train.

With `-m` (a sweep), each job trains in its own process instead: see runner.sweeps.job.job.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, cast

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.types import RunMode
from omegaconf import DictConfig

from runner import outcome
from runner.clusters.end_of_job import telling_servers_the_end
from runner.clusters.local import launch
from runner.clusters.preemption import EXIT_CODE as PREEMPTED_EXIT_CODE
from runner.clusters.roles import resolve, tracks_the_run
from runner.clusters.serving import serve_if_a_server
from runner.compat.hydra_internals import mode_from_command_line, parse_command_line
from runner.config.check import COMPOSITION_ERRORS, CONF_DIR, check_command_line, explain, refuse_unknown_keys
from runner.config.checks import refuse_credentials_in_uri
from runner.config.help import register_help
from runner.config.plain import as_dict
from runner.config.schema import register
from runner.config.settings import checked_metric_targets, checked_targets, objective_of, validate
from runner.entry import prepare_for_tensorflow
from runner.errors import Preempted, RunnerError, report
from runner.lifeline import record_sweep_process, watch
from runner.metric_table import MetricTable
from runner.outcome import FAILED, FINISHED, KILLED, Outcome
from runner.sweeps.launch.launchers import check_launcher, rename_launcher_schemas
from runner.sweeps.study.pruning import trial_reporter
from runner.tracking.opening import opened_tracker
from runner.tracking.run_id_file import read_run_id
from runner.tracking.server_access import check_server
from runner.verbosity import configure, is_verbose, load_tensorflow, loading_tensorflow

if TYPE_CHECKING:
    from runner.training.trainer import RunResult

log = logging.getLogger("runner")


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def main(cfg: DictConfig) -> float | list[float]:
    _task.started = True  # from here on an error is the job's, not the composition's
    prepare_for_tensorflow()  # a job a launcher runs in another process (a Ray worker, a SLURM node) starts here
    # HydraConfig.get() is typed as the HydraConf dataclass, but what it returns is the DictConfig made from it.
    hydra_config = cast(DictConfig, HydraConfig.get())
    if hydra_config.mode == RunMode.MULTIRUN:
        configure(is_verbose(cfg.get("verbose"), hydra_config.verbose))
        # TensorFlow's devices and strategies are process-wide: a sweep job trains in a fresh process.
        from runner.sweeps.job.job import run_sweep_job  # noqa: PLC0415  MLflow: only a sweep job pays for its import

        return run_sweep_job(cfg, hydra_config)
    run_dir = str(hydra_config.runtime.output_dir)
    ending = _Ending(run_dir)
    watch()  # a sweep job's training process stops, resumable, once its sweep is gone (runner.lifeline)
    try:
        ended = _train(cfg, hydra_config, ending)
    except RunnerError as error:
        ended = Outcome(FAILED, 2, report("error", error), task=ending.task)
    except Preempted as stop:
        ended = Outcome(KILLED, PREEMPTED_EXIT_CODE, report("preempted", stop), resumable=True, task=ending.task)
    except KeyboardInterrupt:
        ending.write(Outcome(KILLED, 128 + signal.SIGINT, "error: interrupted (Ctrl-C)", task=ending.task))
        raise
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
        said = "" if code == 0 else f"error: the process exited with status {code}"
        ending.write(Outcome(FINISHED if code == 0 else FAILED, code, said, task=ending.task))
        raise
    except BaseException as error:  # a crash: Hydra prints its traceback, whose last line is this paragraph
        said = " ".join(f"{type(error).__name__}: {error}".split())
        ending.write(Outcome(FAILED, 1, f"error: {said}", task=ending.task))
        raise
    ending.write(ended)
    if ended.status != FINISHED:
        sys.exit(ended.exit_code)
    if not ended.metrics:  # a MultiWorkerMirrored worker: the chief reports for the job
        return float("nan")
    return ended.metrics.get(objective_of(cfg).name, float("nan"))


class _Task:
    """Whether Hydra has composed the config and called the task: an error before that is a refused command line."""

    started = False


_task = _Task()


class _Ending:
    """Where this process's outcome goes: its run directory's file until it knows its task in a cluster."""

    def __init__(self, run_dir: str):
        self.run_dir = run_dir
        self.file: str = outcome.path(run_dir)
        self.task: str | None = None

    def joined(self, task_type: str | None, index: int, run_dir: str) -> None:
        if task_type is not None:
            self.file, self.task = outcome.path(run_dir, task_type, index), f"{task_type} {index}"

    def write(self, ended: Outcome) -> None:
        if ended.run_id is None:  # a run that failed or was stopped still names its MLflow run, if it has one
            ended = replace(ended, run_id=read_run_id(self.run_dir))
        outcome.write(self.file, ended)

    def early(self, table: MetricTable) -> Callable[[RunResult], None]:
        """What tells the run's outcome before its ending (runner.outcome.listen_early): written, then told."""

        def tell(result: RunResult) -> None:
            ended = outcome.finished(result, table, task=self.task)
            self.write(ended)
            outcome.tell_early(ended)

        return tell


def _train(cfg: DictConfig, hydra_config: DictConfig, ending: _Ending) -> Outcome:
    """Check the config, train (or launch the local cluster that trains), and say how it ended."""
    refuse_unknown_keys(cfg, OverridesParser.create().parse_overrides(list(hydra_config.overrides.task)))
    settings = validate(as_dict(cfg))
    verbose = is_verbose(settings.verbose, hydra_config.verbose)
    configure(verbose)  # before MLflow and TensorFlow load, here and in the processes started below
    # The `_target_`s import and take their arguments (the built-ins are checked without TensorFlow; a
    # user's module may import it at its top, so its loading lines are filtered here too). The metrics' Keras
    # classes import TensorFlow: they are checked once it has loaded, below.
    with loading_tensorflow(verbose):
        settings = checked_targets(settings, metrics=False)
    # Before TensorFlow loads and before any run exists: a server that is down, or that refuses this
    # user's credentials (401) or run (403), stops the job in a fraction of a second.
    check_server(settings.mlflow, registers=settings.mlflow.register)
    if settings.cluster.kind == "local":
        # This process starts and watches the cluster's tasks; its chief trains and says how the job ended.
        # A bad metric is refused here, once, not by each task.
        with loading_tensorflow(verbose):
            settings = checked_metric_targets(settings)
        return launch(settings, hydra_config)
    # Before TensorFlow is imported: MLflow's import and store open on the other core meanwhile. In a cluster
    # only the chief tracks, and its workers train in step with it: none of them waits for MLflow.
    # An Optuna trial's training process reports each epoch to its study, whose pruner may stop it (None outside a
    # study; a pruner outside a sweep is refused here, before TensorFlow loads).
    chief = tracks_the_run(settings)
    reporter = trial_reporter(settings.composed, chief)
    with opened_tracker(settings.mlflow, tracks=chief) as tracker:
        # Imported after validation: a mistyped override fails before TensorFlow loads.
        load_tensorflow(verbose)
        # Before any run exists (the tracker's process creates nothing until the run starts).
        settings = checked_metric_targets(settings)
        run_dir = hydra_config.runtime.output_dir
        task = resolve(settings)
        ending.joined(task.type, task.index, run_dir)
        serve_if_a_server(task, settings, run_dir, ending.write)  # a server serves here, then ends the process
        from runner.train import run  # noqa: PLC0415  TensorFlow: imported only once the config is known to be good

        with telling_servers_the_end(task, settings, run_dir):
            listeners = [reporter] if reporter is not None else []
            early = ending.early(settings.metric_table) if outcome.heard_early() else None
            result = run(settings, run_dir, tracker, list(hydra_config.overrides.task), task, listeners, early)
    if not task.chief:
        return Outcome(FINISHED, task=ending.task)
    table = settings.metric_table
    ended = outcome.finished(result, table, task=ending.task)
    reported = (*(f"{split}_{each.name}" for each in table.scores for split in ("test", "eval")), "test_loss")
    said = ", ".join(f"{key} {ended.metrics[key]:.4f}" for key in reported)
    log.info("done: %s, MLflow run %s", said, ended.run_id)
    return ended


def refuse_credentials_in_arguments(arguments: list[str]) -> None:
    """A tracking URI with user:password@ on the command line: refused before Hydra records the overrides
    in the run directory (.hydra/overrides.yaml, config.yaml)."""
    for argument in arguments:
        key, _, value = argument.partition("=")
        if key.lstrip("+~") == "mlflow.tracking_uri" and value:
            for uri in value.split(","):  # a sweep over several servers
                refuse_credentials_in_uri("mlflow.tracking_uri", uri.strip("'\""))


def cli() -> None:
    """The command: `python -m runner ...` and the `runner` script."""
    prepare_for_tensorflow()
    # Inherited by the processes this command starts: a sweep's jobs hand it to their training (runner.lifeline).
    record_sweep_process()
    try:
        refuse_credentials_in_arguments(sys.argv[1:])
        check_launcher(sys.argv[1:])  # before Hydra, whose error for a missing launcher plugin is a traceback
        rename_launcher_schemas()
        register()  # the schema, conf/config.yaml's first default
        register_help()  # the groups --help lists, from conf/ and hydra.searchpath
        _compose_and_run(sys.argv[1:])
    except RunnerError as error:
        paragraph = report("error", error)
        if os.environ.get(outcome.OUTCOME_VARIABLE):  # a supervisor started this process and reads how it ended
            outcome.write(outcome.path("", environ=os.environ), Outcome(FAILED, 2, paragraph))
        sys.exit(2)


def _compose_and_run(arguments: list[str]) -> None:
    """Hydra composes the command line once and runs it. What Hydra refuses to compose (an unknown key or option,
    a value of the wrong type) is explained as the runner's paragraph, with the closest valid key or option."""
    # Hydra then raises what it refuses instead of printing it and exiting 1 (hydra/_internal/utils.py).
    os.environ["HYDRA_FULL_ERROR"] = "1"
    _task.started = False  # a warm sweep worker composes one command line after another (runner.warm_worker)
    options = parse_command_line(arguments)
    if options is not None and options.multirun and options.cfg:
        # Hydra refuses --cfg with -m before it composes anything; the runner checks the sweep's every point first,
        # so that `python -m runner -m ... --cfg job` says whether the sweep would start.
        check_command_line(arguments)
    try:
        with mode_from_command_line(arguments):
            main()
    except COMPOSITION_ERRORS as error:
        if _task.started:
            raise
        said = " ".join(str(error).split())
        raise explain(arguments) or RunnerError(
            f"{said}. Fix: correct the command line or the config it names."
        ) from None


if __name__ == "__main__":
    cli()
