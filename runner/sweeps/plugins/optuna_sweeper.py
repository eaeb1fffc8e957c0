"""`hparams_search=optuna`: the sweeper that asks Optuna for trials, launches each as one sweep job through Hydra's
launcher, and tells Optuna how it ended (COMPLETE with its objective, PRUNED, or FAIL), on Optuna's ask/tell API.

Each of `slots` threads asks for a trial, launches it as a batch of one (its job number is the trial number, so
job directory N is trial N) and tells its result, so a slot that frees gets the next trial at once: no trial waits
for the slowest of a batch. That needs a launcher that can launch from several threads (joblib's and submitit's:
each launch is its own pool call or submission); with another (the basic launcher runs jobs in this process,
Ray's starts its own cluster state), the trials run in batches of `slots`, as Hydra's Optuna sweeper did.

The study lives in storage every job reaches (runner.sweeps.study.study); re-running the command with the same sweep
directory continues it: the trials it left RUNNING run again in their own job directories (each resumes from its
checkpoint and continues its MLflow run), and new trials are asked only until the study holds n_trials in all.
Hydra finds the class in hydra_plugins/runner_optuna_sweeper.py, which delegates here.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import optuna
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, JobStatus
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from optuna.trial import TrialState

from runner.compat.hydra_internals import job_error
from runner.config.components import import_target
from runner.errors import RunnerError
from runner.sweeps.launch.launchers import class_path, launcher_of
from runner.sweeps.study.study import (
    DUPLICATE_ATTR,
    PRUNED_TAG,
    RESULTS_FILE,
    SWEEP_DIR_ATTR,
    SearchSpace,
    end_trial,
    frozen_trial,
    live_trial,
    open_storage,
)
from runner.sweeps.study.terminator import StudyTerminator, study_terminator
from runner.sweeps.sweep_config import SweepConfig
from runner.sweeps.terms import STOPPED_EARLY_TAG, read_parent_run_id

log = logging.getLogger("runner")

# Optuna's system attribute on a trial queued with enqueue_trial (optuna/study/study.py, enqueue_trial).
ENQUEUED_SYSTEM_ATTR = "fixed_params"
# How often a slot holding a repeated configuration looks whether its original has ended.
DUPLICATE_POLL_SECONDS = 2.0


def launcher_parallelism(launcher: Any) -> int:
    """How many jobs the launcher runs at once (its record's parallelism); 1 for a launcher of a user's own."""
    known = launcher_of(class_path(launcher))
    return known.parallelism(launcher) if known is not None else 1


def launches_from_threads(launcher: Any) -> bool:
    known = launcher_of(class_path(launcher))
    return known is not None and known.launches_from_threads


class OptunaSweep:
    """One sweep: the sweeper's settings (conf/hydra/sweeper/optuna.yaml), its launcher, its study."""

    def __init__(self, config: DictConfig, launcher: Any):
        """`config`: the sweep's composed config, its `hydra` node included (the sweeper's settings are its
        `hydra.sweeper`); `launcher`: Hydra's launcher, set up."""
        self.config = config
        self.sweep = SweepConfig.read(config)
        if self.sweep.optuna is None or self.sweep.study is None or self.sweep.sweep_dir is None:
            raise RunnerError(
                f"hydra.sweeper._target_={self.sweep.sweeper} is not the runner's Optuna sweeper. Fix: select it with "
                "hparams_search=optuna (or hydra/sweeper=optuna)."
            )
        self.settings = self.sweep.optuna
        self.study_address = self.sweep.study
        self.launcher = launcher
        self.sweep_dir = self.sweep.sweep_dir
        self.lock = threading.Lock()

    def run(self, arguments: list[str]) -> list[JobReturn]:
        os.makedirs(self.sweep_dir, exist_ok=True)
        OmegaConf.save(self.config, os.path.join(self.sweep_dir, "multirun.yaml"))
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        space = SearchSpace.parse(self.settings.params or {}, arguments)
        storage = self.study_address.storage
        directions = self.sweep.goals.study_directions  # one per objective
        study = optuna.create_study(
            study_name=self.study_address.name,
            storage=open_storage(storage),
            sampler=optuna.samplers.RandomSampler(),  # replaced below, once the study's trials are known
            directions=directions,
            load_if_exists=True,
        )
        _check_continued_directions(study, directions, storage)
        # The sampler's config node, instantiated here (continued_sampler); a sampler object, as it is.
        node = self.settings.sampler
        sampler = OmegaConf.to_container(node) if isinstance(node, DictConfig) else node
        study.sampler = continued_sampler(sampler, len(study.trials), instantiate)
        n_trials = self.settings.n_trials
        if not study.trials:  # queued once: a re-run of the command finds them among the study's trials
            for text in self.settings.enqueue:
                study.enqueue_trial(_enqueued_params(text, space))
        slots = self._slots(n_trials)
        state = _Progress(
            study,
            space,
            n_trials,
            self.sweep_dir,
            self._terminator(),
            search_space_extender(self.settings.custom_search_space, self.config),
            self.settings.max_failure_rate,
        )
        log.info(
            "Optuna study %r in %s: %d of %d trials done, %d slot(s); sampler %s",
            study.study_name,
            storage if "://" not in storage else storage.split("://")[0] + "://...",
            state.done(),
            n_trials,
            slots,
            type(study.sampler).__name__,
        )
        returns: list[JobReturn] = []
        if slots > 1 and not launches_from_threads(self.launcher):
            log.info("%s launches from one thread: trials run in batches of %d", class_path(self.launcher), slots)
            self._in_batches(state, slots, returns)
        else:
            self._in_slots(state, slots, returns)
        if state.stopped_early:
            self._tag_stopped_early(state.stopped_early)
        self._report_best(study, state.stopped_early)
        return returns

    def _terminator(self) -> StudyTerminator | None:
        """The study's terminator (hydra.sweeper.terminate), or None."""
        return study_terminator(
            self.settings.terminate,
            self.settings.terminate_min_trials,
            self.sweep.sweep.folds,
            self.sweep.job.seed if isinstance(self.sweep.job.seed, int) else None,
        )

    def _tag_stopped_early(self, reason: str) -> None:
        """The sweep's parent run says why its study ended before n_trials (the summary shows it)."""
        from mlflow.tracking import MlflowClient  # noqa: PLC0415  MLflow: only in a study its terminator ended

        parent_id = read_parent_run_id(self.sweep_dir)
        if parent_id is not None:
            client = MlflowClient(tracking_uri=self.sweep.tracking_uri)
            client.set_tag(parent_id, STOPPED_EARLY_TAG, reason)

    def _slots(self, n_trials: int) -> int:
        requested = self.settings.n_jobs
        slots = launcher_parallelism(self.launcher) if requested is None else requested
        return max(1, min(slots, n_trials))

    def _in_slots(self, state: _Progress, slots: int, returns: list[JobReturn]) -> None:
        errors: list[BaseException] = []

        def slot() -> None:
            try:
                while True:
                    with self.lock:
                        trial = state.next_trial()
                    if trial is None:
                        return
                    original = state.same_configuration(trial)
                    if original is not None and state.settle_duplicate(trial, original):
                        continue
                    [ret] = self.launcher.launch([state.overrides(trial)], initial_job_idx=trial.number)
                    with self.lock:
                        returns.append(ret)
                        state.tell(trial, ret)
            except BaseException as error:  # re-raised in the sweep's thread below
                errors.append(error)

        if slots == 1:
            slot()
        else:
            threads = [threading.Thread(target=slot, name=f"optuna-slot-{n}", daemon=True) for n in range(slots)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        if errors:
            raise errors[0]

    def _in_batches(self, state: _Progress, slots: int, returns: list[JobReturn]) -> None:
        while True:
            asked = [trial for trial in (state.next_trial() for _ in range(slots)) if trial is not None]
            if not asked:
                return
            # A configuration proposed again waits for its original (in this batch, or told already).
            repeats = [(trial, original) for trial in asked if (original := state.same_configuration(trial))]
            repeated = {trial.number for trial, _ in repeats}
            trials = [trial for trial in asked if trial.number not in repeated]
            self._launch_batch(state, trials, returns)
            again = [trial for trial, original in repeats if not state.settle_duplicate(trial, original)]
            self._launch_batch(state, again, returns)

    def _launch_batch(self, state: _Progress, trials: list, returns: list[JobReturn]) -> None:
        if not trials:
            return
        numbers = [trial.number for trial in trials]
        if numbers == list(range(numbers[0], numbers[0] + len(numbers))):  # job numbers are trial numbers
            batch = list(self.launcher.launch([state.overrides(t) for t in trials], initial_job_idx=numbers[0]))
        else:  # a re-run's unfinished trials, or trials of another sweep on the same storage, in between
            batch = [self.launcher.launch([state.overrides(t)], initial_job_idx=t.number)[0] for t in trials]
        for trial, ret in zip(trials, batch, strict=True):
            returns.append(ret)
            state.tell(trial, ret)

    def _report_best(self, study, stopped_early: str | None) -> None:
        completed = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        pruned = study.get_trials(deepcopy=False, states=(TrialState.PRUNED,))
        failed = study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
        log.info(
            "Optuna study %r: %d complete, %d pruned, %d failed",
            study.study_name,
            len(completed),
            len(pruned),
            len(failed),
        )
        if not completed:
            return
        results: dict[str, Any] = {"name": "optuna"}
        if len(study.directions) > 1:  # Optuna's Pareto front, as Hydra's Optuna sweeper writes it
            front = study.best_trials
            results["solutions"] = [
                {"params": trial.params, "values": trial.values, "trial": trial.number} for trial in front
            ]
            log.info("Pareto front: %s", "; ".join(f"{t.params} {t.values}" for t in front) or "none feasible")
        else:
            best = study.best_trial
            results.update(best_params=best.params, best_value=best.value, best_trial=best.number)
            log.info("Best parameters: %s", best.params)
            log.info("Best value: %s", best.value)
        if stopped_early:
            results["stopped_early"] = stopped_early
        with open(os.path.join(self.sweep_dir, RESULTS_FILE), "w") as handle:
            handle.write(OmegaConf.to_yaml(OmegaConf.create(results)))


class _Progress:
    """The study as this sweep goes through it: which trial runs next, and how each ended."""

    def __init__(
        self,
        study,
        space: SearchSpace,
        n_trials: int,
        sweep_dir: str,
        terminator: StudyTerminator | None = None,
        extend: Callable[[Any], None] | None = None,
        max_failure_rate: float | None = None,
    ):
        self.study, self.space, self.n_trials, self.sweep_dir = study, space, n_trials, sweep_dir
        self.terminator = terminator
        # hydra.sweeper.custom_search_space, bound to the sweep's config: suggests a new trial's further parameters.
        self.extend = extend
        self.max_failure_rate = max_failure_rate  # hydra.sweeper.max_failure_rate
        self.stopped_early: str | None = None  # why the terminator or the failures ended the study, once they have
        # Trials this sweep directory's last command left RUNNING (it was killed): they run again first.
        self.unfinished = [
            trial
            for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            if trial.user_attrs.get(SWEEP_DIR_ATTR) == sweep_dir
        ]
        self.rerun = {trial.number for trial in self.unfinished}

    def done(self) -> int:
        ended = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
        return len(self.study.get_trials(deepcopy=False, states=ended))

    def next_trial(self):
        """The next trial to launch (a live optuna Trial), or None once the study holds n_trials."""
        if self.unfinished:
            frozen = self.unfinished.pop(0)
            log.info("trial %d was left running by an earlier command: it runs again", frozen.number)
            return live_trial(self.study, frozen.number)
        started = (TrialState.RUNNING, TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
        if len(self.study.get_trials(deepcopy=False, states=started)) >= self.n_trials or self._should_stop():
            return None
        trial = self.study.ask(fixed_distributions=self.space.distributions)
        trial.set_user_attr(SWEEP_DIR_ATTR, self.sweep_dir)
        if self.extend is not None:
            self._extended(trial)
        return trial

    def _extended(self, trial) -> None:
        """hydra.sweeper.custom_search_space's parameters added to `trial`; one that a fixed override also sets is
        one paragraph (the job would be given the key twice), the trial FAIL."""
        assert self.extend is not None
        self.extend(trial)
        twice = sorted(set(trial.params) & set(self.space.fixed))
        if twice:
            end_trial(self.study, trial, None)
            raise RunnerError(
                f"hydra.sweeper.custom_search_space suggested {', '.join(twice)}, which the sweep also sets to one "
                "value. Fix: drop those keys from the command line and hydra.sweeper.params, or suggest other ones."
            )

    def _should_stop(self) -> bool:
        """hydra.sweeper.terminate and max_failure_rate: no new trial once the terminator finds the study done, or
        once too many of its trials failed (trials still running finish)."""
        if self.stopped_early is None and self.terminator is not None:
            self.stopped_early = self.terminator.reason_to_stop(self.study)
        if self.stopped_early is None and self.max_failure_rate is not None:
            self.stopped_early = self._too_many_failures(self.max_failure_rate)
        if self.stopped_early:
            log.info("Optuna study %r: %s; no new trial", self.study.study_name, self.stopped_early)
        return self.stopped_early is not None

    def _too_many_failures(self, rate: float) -> str | None:
        """Why the study stops for its failures (more than `rate` of its ended trials FAIL), or None."""
        ended = self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL))
        failed = sum(trial.state == TrialState.FAIL for trial in ended)
        if not ended or failed / len(ended) <= rate:
            return None
        return (
            f"the study stopped after {failed} of its {len(ended)} ended trials failed, more than "
            f"hydra.sweeper.max_failure_rate={rate:g} allows"
        )

    def overrides(self, trial) -> list[str]:
        return self.space.overrides(trial.params)

    def _frozen(self, trial):
        return frozen_trial(self.study, trial.number)

    def same_configuration(self, trial):
        """The earlier trial whose configuration the sampler proposed again for `trial` (COMPLETE, PRUNED or still
        RUNNING), or None. A trial queued with hydra.sweeper.enqueue is the user's own request, and a trial run
        again after a killed command is not a proposal: both train."""
        if trial.number in self.rerun or ENQUEUED_SYSTEM_ATTR in self._frozen(trial).system_attrs:
            return None
        states = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
        earlier = self.study.get_trials(deepcopy=False, states=states)
        return next((o for o in earlier if o.number < trial.number and o.params == trial.params), None)

    def settle_duplicate(self, trial, original) -> bool:
        """`trial` repeats `original`'s configuration: once `original` has ended, told its result without training
        and marked (DUPLICATE_ATTR), so that no configuration is trained twice and no run counts twice as a
        replicate. False (train it after all) where `original` failed."""
        while (original := self._frozen(original)).state == TrialState.RUNNING:
            time.sleep(DUPLICATE_POLL_SECONDS)  # another slot trains it
        if original.state == TrialState.FAIL:
            return False
        trial.set_user_attr(DUPLICATE_ATTR, original.number)
        for key, violation in original.constraints.items():  # infeasible as its original is
            trial.set_constraint(key, violation)
        end_trial(self.study, trial, original.values, pruned=original.state == TrialState.PRUNED)
        log.info(
            "trial %d: the sampler proposed trial %d's configuration again (%s): told its result (%s), not trained",
            trial.number,
            original.number,
            " ".join(self.space.overrides(trial.params)[len(self.space.fixed) :]),
            original.values if original.state == TrialState.COMPLETE else "PRUNED",
        )
        return True

    def tell(self, trial, ret: JobReturn) -> None:
        """The trial's job ended: FAIL if it failed, PRUNED if its pruner stopped it, else COMPLETE with its value."""
        value = ret.return_value if ret.status == JobStatus.COMPLETED else None
        state = end_trial(self.study, trial, value if _is_value(value) else None)
        if ret.status != JobStatus.COMPLETED:
            log.error("trial %d failed: %s", trial.number, job_error(ret))
        elif state == "PRUNED":
            log.info("trial %d pruned at epoch %s", trial.number, self._frozen(trial).user_attrs[PRUNED_TAG])


def continued_sampler(sampler: Any, asked: int, instantiate: Callable[[Any], Any]) -> Any:
    """The sampler of a study that already holds `asked` trials: its configured seed moved on by that many, so that
    a re-run of a killed sweep draws on where the first command's draws stopped instead of repeating them (a
    sampler rebuilt with the same seed repeats its random start-up draws). A new study (asked=0) gets the seed as
    configured; a sampler without a seed draws afresh anyway; a sampler object (not a config node) is used as it
    is."""
    if not isinstance(sampler, Mapping):
        return sampler
    node = dict(sampler)
    if asked and isinstance(node.get("seed"), int):
        node["seed"] += asked
    return instantiate(node)


def _is_value(value: Any) -> bool:
    """A job's answer: its objective, or a list of them (one per objective of a sweep over several)."""
    if isinstance(value, (list, tuple)):
        return bool(value) and all(_is_value(item) for item in value)
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_continued_directions(study: optuna.Study, directions: Sequence[str], storage: str) -> None:
    """A study continued from its storage keeps the directions it was created with (Optuna loads it as it is): one
    that differs from this sweep's would rank its trials one way and the sweep's summary the other."""
    stored = [direction.name.lower() for direction in study.directions]
    if stored != directions:
        shown, asked = ",".join(stored), ",".join(directions)
        raise RunnerError(
            f"the Optuna study {study.study_name!r} in {storage} was created to {shown} its objective(s), and this "
            f"sweep would {asked} them (sweep.objective and its direction, or hydra.sweeper.direction). Fix: pass "
            f"hydra.sweeper.direction={stored[0] if len(stored) == 1 else '[' + shown + ']'} to continue the study "
            "as it was, or start a new one with another hydra.sweep.dir (or hydra.sweeper.study_name)."
        )


def _enqueued_params(text: Any, space: SearchSpace) -> dict[str, Any]:
    """One `hydra.sweeper.enqueue` item ("optimizer.lr=0.01 batch=64") as the trial's params."""
    if not isinstance(text, str):
        raise RunnerError(
            f"hydra.sweeper.enqueue item {text!r} is not valid: each item is one trial's values as overrides. "
            "Fix: write e.g. hydra.sweeper.enqueue=['optimizer.lr=0.01 batch=64']."
        )
    params: dict[str, Any] = {}
    for override in OverridesParser.create().parse_overrides(text.split()):
        key = override.get_key_element()
        if key not in space.distributions:
            raise RunnerError(
                f"hydra.sweeper.enqueue item {text!r} is not valid: {key} is not in the search space "
                f"({', '.join(space.distributions) or 'empty'}). Fix: give values of the searched keys only."
            )
        params[key] = override.value()
    return params


def check_settings(config: DictConfig, sweep: SweepConfig) -> None:
    """Before the sweep's parent run exists (its settings already checked by SweepConfig.read): the search space
    parses and the queued trials lie in it."""
    assert sweep.optuna is not None  # an Optuna sweep's
    arguments = [str(item) for item in config.hydra.overrides.task]
    try:
        space = SearchSpace.parse(sweep.optuna.params or {}, arguments)
    except (ValueError, TypeError) as error:
        raise RunnerError(
            f"hydra.sweeper.params is not valid: {error}. Fix: give each searched key as choice(a, b), range(a, b), "
            "interval(a, b) or tag(log, interval(a, b)), e.g. hydra.sweeper.params.batch='choice(32, 64)'."
        ) from None
    for text in sweep.optuna.enqueue:
        _enqueued_params(text, space)
    search_space_extender(sweep.optuna.custom_search_space, config)  # it imports


def search_space_extender(path: str | None, config: DictConfig) -> Callable[[Any], None] | None:
    """hydra.sweeper.custom_search_space: the function, called with the sweep's config and each new trial (as
    Hydra's Optuna sweeper calls it); None without one."""
    if path is None:
        return None
    function = import_target("hydra.sweeper.custom_search_space", path)
    return lambda trial: function(config, trial)


def sweep(sweeper: Any, arguments: list[str]) -> list[JobReturn]:
    """The plugin's sweep(): `sweeper` was set up by Hydra (config, launcher)."""
    return OptunaSweep(sweeper.config, sweeper.launcher).run(arguments)
