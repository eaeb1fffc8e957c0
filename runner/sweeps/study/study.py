"""An Optuna sweep's study and its search space: where the study is stored (by default a journal file in the sweep
directory, so that every job, wherever it runs, and a re-run of the same command reach it), Hydra's `params` syntax
turned into Optuna distributions and back into a job's overrides, and the link a job's training process follows
to its own trial (TRIAL_VARIABLE). Optuna is imported only inside the functions: this module is read by the sweep
callback and the sweep job, which run for every sweep."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, Override, RangeSweep, Transformer
from omegaconf import OmegaConf

from runner.compat.optuna_internals import trial_id
from runner.errors import RunnerError
from runner.sweeps.terms import SWEEPER_TARGET

# Set by a sweep job for its training process: JSON of a TrialLink.
TRIAL_VARIABLE = "RUNNER_OPTUNA_TRIAL"
# On a trial (an Optuna user attribute) and on its child run (a tag): the epoch after which the pruner stopped it.
PRUNED_TAG = "pruned_at_epoch"
# On a trial the sampler proposed with an earlier trial's configuration: that trial's number. It was told that
# trial's result and never trained (runner.sweeps.plugins.optuna_sweeper).
DUPLICATE_ATTR = "duplicate_of"
# On a trial of a configuration trained over several seeds or folds: its objective in each, in the order trained
# (runner.sweeps.study.terminator measures the noise between replicates from them).
REPLICATES_ATTR = "replicate_values"
# On a trial: the sweep directory whose command asked for it (a re-run continues the trials it left RUNNING).
SWEEP_DIR_ATTR = "sweep_dir"
RESULTS_FILE = "optimization_results.yaml"


def is_optuna_sweep(config: Any) -> bool:
    return OmegaConf.select(config, "hydra.sweeper._target_") == SWEEPER_TARGET


def open_storage(storage: str):
    """An Optuna storage for storage_of()'s string; one paragraph if it cannot be opened."""
    import optuna  # noqa: PLC0415  Optuna: only in the processes of an Optuna or pruned sweep

    try:
        if "://" in storage:
            return optuna.storages.RDBStorage(storage)
        from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock  # noqa: PLC0415  Optuna: only in the processes of an Optuna or pruned sweep

        os.makedirs(os.path.dirname(storage), exist_ok=True)
        # An open(O_EXCL) lock file works on the shared filesystems SLURM nodes use, unlike a symlink on some.
        return optuna.storages.JournalStorage(JournalFileBackend(storage, lock_obj=JournalFileOpenLock(storage)))
    except Exception as error:  # SQLAlchemy's, a driver's or the filesystem's error: all mean the same to the user
        message = " ".join(str(error).split())[:400].rstrip(".")
        raise RunnerError(
            f"hydra.sweeper.storage={_without_password(storage)!r} could not be opened: {type(error).__name__}: "
            f"{message}. Fix: give a reachable database URL with an installed driver (SQLAlchemy 2.1 reads "
            "postgresql:// as psycopg 3; with psycopg2, write postgresql+psycopg2://user@host/optuna) or a writable "
            "file path, or leave it null for a journal file in the sweep directory."
        ) from None


def _without_password(url: str) -> str:
    scheme, separator, rest = url.partition("://")
    if separator and "@" in rest:
        credentials, _, host = rest.rpartition("@")
        if ":" in credentials:
            return f"{scheme}://{credentials.split(':')[0]}:***@{host}"
    return url


@dataclass(frozen=True)
class TrialLink:
    """What a job's training process needs to report to its trial: the storage, the study and the trial number, and
    the step its epoch 1 follows. A trial trains its seeds and folds one run after another, each run's epochs
    continuing the steps of the run before (run k's epoch e is step k x epochs + e), so that the pruner compares
    the same seed's and fold's epoch across trials."""

    storage: str
    study: str
    number: int
    first_step: int = 0

    def to_environment(self) -> dict[str, str]:
        return {TRIAL_VARIABLE: json.dumps(asdict(self))}

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> TrialLink | None:
        text = environ.get(TRIAL_VARIABLE)
        return cls(**json.loads(text)) if text else None

    def open(self, pruner=None):
        """The study (with `pruner`, which decides should_prune) and this trial, as a live optuna Trial."""
        import optuna  # noqa: PLC0415  Optuna: only in the processes of an Optuna or pruned sweep

        study = optuna.load_study(study_name=self.study, storage=open_storage(self.storage), pruner=pruner)
        return study, live_trial(study, self.number)


def frozen_trial(study, number: int):
    """The study's trial `number` as it stands in the storage (a FrozenTrial)."""
    return next(trial for trial in study.get_trials(deepcopy=False) if trial.number == number)


def live_trial(study, number: int):
    """The study's trial `number` as a live optuna Trial, to report to or tell (Optuna makes one from the trial's
    storage id, which a FrozenTrial holds)."""
    import optuna  # noqa: PLC0415  Optuna: only in the processes of an Optuna or pruned sweep

    return optuna.trial.Trial(study, trial_id(frozen_trial(study, number)))


def end_trial(study, trial, value: float | Sequence[float] | None, pruned: bool = False) -> str:
    """How every trial ends, in every kind of study (an Optuna sweep's, a pruned grid's), through Optuna's tell:
    PRUNED if `pruned` (a configuration proposed again, whose original was pruned); FAIL without a value (its job
    failed); PRUNED if its pruner stopped it (PRUNED_TAG among its user attributes); COMPLETE with a finite `value`
    (a list of them, one per objective, in a study of several); FAIL otherwise (a failed run's worst value). Returns
    the state's name."""
    from optuna.trial import TrialState  # noqa: PLC0415  Optuna: only in the processes of an Optuna or pruned sweep

    values = None if value is None else [float(v) for v in (value if isinstance(value, Sequence) else [value])]
    if pruned or values is not None and PRUNED_TAG in frozen_trial(study, trial.number).user_attrs:
        state = TrialState.PRUNED
        study.tell(trial, state=state)
    elif values and all(math.isfinite(v) for v in values):
        state = TrialState.COMPLETE
        study.tell(trial, values if len(values) > 1 else values[0])
    else:
        state = TrialState.FAIL
        study.tell(trial, state=state)
    return state.name


class SearchSpace:
    """Hydra's sweep syntax as Optuna distributions: `choice(a, b)` and `a,b` (and a YAML list) are categorical,
    `range(a, b[, step])` an integer (or float) grid, `interval(a, b)` uniform and `tag(log, interval(a, b))`
    log-uniform (integers if both ends are); a plain value is passed to every trial unchanged."""

    def __init__(self, distributions: dict[str, Any], fixed: dict[str, str]):
        self.distributions = distributions
        self.fixed = fixed

    @classmethod
    def parse(cls, params: Mapping[str, Any] | None, arguments: Iterable[str]) -> SearchSpace:
        """`params`: hydra.sweeper.params; `arguments`: the command line's overrides (which win)."""
        texts = [f"{key}={_as_override_value(value)}" for key, value in _flat(params or {})]
        texts += list(arguments)
        distributions: dict[str, Any] = {}
        fixed: dict[str, str] = {}
        for override in OverridesParser.create().parse_overrides(texts):
            key = override.get_key_element()
            distributions.pop(key, None)
            fixed.pop(key, None)
            if override.is_sweep_override():
                distributions[key] = _distribution(override)
            else:
                fixed[key] = override.get_value_element_as_str()
        return cls(distributions, fixed)

    def overrides(self, params: Mapping[str, Any]) -> list[str]:
        """A trial's overrides: the fixed ones, then its sampled values (`key=value`, repr for floats)."""
        return [f"{key}={value}" for key, value in self.fixed.items()] + [
            f"{key}={_as_override_value(value)}" for key, value in params.items()
        ]


def _flat(params: Mapping[str, Any], prefix: str = "") -> Iterable[tuple[str, Any]]:
    """`optimizer.lr: ...` as written, or nested (`hydra.sweeper.params.optimizer.lr=...` on the command line)."""
    for key, value in params.items():
        if isinstance(value, Mapping):
            yield from _flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _as_override_value(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ",".join(_as_override_value(item) for item in value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


def _distribution(override: Override) -> Any:
    from optuna.distributions import (  # noqa: PLC0415  Optuna: only in the processes of an Optuna sweep
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    value = override.value()
    if override.is_choice_sweep() or (isinstance(value, RangeSweep) and value.shuffle):
        choices: list[Any] = list(override.sweep_iterator(transformer=Transformer.encode))
        return CategoricalDistribution(choices)
    if isinstance(value, RangeSweep):
        assert value.start is not None and value.stop is not None
        step = value.step if value.step is not None else 1
        if any(isinstance(item, float) for item in (value.start, value.stop, step)):
            # Hydra's range excludes its stop; Optuna's high is inclusive.
            return FloatDistribution(value.start, value.stop - step, step=step)
        return IntDistribution(int(value.start), int(value.stop) - int(step), step=int(step))
    if isinstance(value, IntervalSweep):
        assert value.start is not None and value.end is not None
        log = "log" in value.tags
        if isinstance(value.start, int) and isinstance(value.end, int):
            return IntDistribution(value.start, value.end, log=log)
        return FloatDistribution(float(value.start), float(value.end), log=log)
    assert isinstance(value, ChoiceSweep)  # the only other sweep
    items: list[Any] = list(value.list)
    return CategoricalDistribution(items)
