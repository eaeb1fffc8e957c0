"""Hydra's refusals of a command line, and a sweep's every point, as one paragraph with the closest valid key or option.

Hydra composes the command's config once. When it refuses an override (`epoch=1`: "Could not override 'epoch'",
`loop=multistep`: "Could not find 'loop/multistep'"), `explain` finds the override at fault (composing again,
only then) and words the refusal as the runner does, with the closest key or option, exit 2. A sweep's points
are composed by its launcher only when they run: `check_sweep_points`, called by the sweep's callback before its
parent run exists, checks each swept value (set on a copy of the sweep's config, or composed where it picks a
group's option): unknown keys, values of the wrong type, and its `_target_` callables against their signatures.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException, MissingConfigException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

from runner.compat.hydra_internals import parse_command_line
from runner.config.components import check_targets
from runner.config.help import group_names, group_options
from runner.config.plain import as_dict, job_config
from runner.config.schema import (
    OPEN_GROUPS,
    TARGET_ARGUMENTS,
    TARGET_GROUPS,
    Settings,
    config_name,
    declared,
    group_class,
    register,
)
from runner.config.settings import check_named_metrics, sweep_settings, target_components, validate
from runner.errors import RunnerError
from runner.searchpath import searchpath_overrides


def config_dir() -> Path:
    """The config the command composes: the copy of the repository's conf/ that an installed wheel carries
    inside the package (runner/conf), or else, in a checkout (`pip install -e .`, or the package on PYTHONPATH),
    the repository's conf/ itself, next to the package."""
    package = Path(__file__).resolve().parents[1]
    shipped = package / "conf"
    return shipped if (shipped / "config.yaml").is_file() else package.parent / "conf"


CONF_DIR = config_dir()
CONFIG_NAME = "config"
# Hydra options after which there is nothing to compose, or a config this check cannot see (Hydra handles them).
_NOT_COMPOSED = ("help", "hydra_help", "info", "shell_completion", "config_dir", "config_path", "experimental_rerun")
_SEE_KEYS = "python -m runner --cfg job prints every key with its value"
_CLOSE = 0.65  # how alike a name must be to be suggested (batch_size -> batch: 0.67; pruner -> runtime: 0.62)
# What composing a command line can raise: Hydra's refusals, OmegaConf's, and a config file that is not YAML.
COMPOSITION_ERRORS = (HydraException, OmegaConfBaseException, yaml.YAMLError)


def compose_config(
    overrides: Sequence[str] = (), return_hydra_config: bool = False, config_name: str = CONFIG_NAME
) -> DictConfig:
    """conf/config.yaml composed with `overrides`, as `python -m runner <overrides>` composes it."""
    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="runner"):
        return compose(config_name, list(overrides), return_hydra_config=return_hydra_config)


def explain(arguments: Sequence[str]) -> RunnerError | None:
    """The paragraph for a command line Hydra refused to compose, or None where the runner cannot tell which
    override is at fault (another config directory: Hydra's own message stands)."""
    try:
        check_command_line(arguments)
    except RunnerError as error:
        return error
    return None


def check_command_line(arguments: Sequence[str]) -> None:
    """Compose `python -m runner <arguments>` as Hydra does (a sweep: its config, then each swept value) and raise
    the paragraph for the first override Hydra, the schema or a `_target_`'s signature refuses."""
    options = parse_command_line(arguments)
    if options is None or any(getattr(options, name, None) for name in _NOT_COMPOSED):
        return
    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="runner"):
        composer = _Composer(options.config_name or CONFIG_NAME)
        overrides = composer.parse(options.overrides)
        first = [values[0] for values in map(_values, overrides) if values]
        config = composer.compose(first, return_hydra_config=True)
        multirun = options.multirun or str(OmegaConf.select(config, "hydra.mode")) == "RunMode.MULTIRUN"
        swept = [override for override in overrides if override.is_sweep_override()]
        if swept and not multirun:
            line = str(swept[0].input_line)
            value = line.partition("=")[2]  # the override as typed, after its key
            raise RunnerError(
                f"{line} is not valid: it gives several values, which is a sweep, and this command trains one run. "
                f"Fix: add -m to train one run per value (python -m runner -m {line}), or write a list as "
                f"{swept[0].get_key_element()}=[{value}] or a string as {swept[0].get_key_element()}='{value}'.",
                key=swept[0].key_or_group,
            )
        refuse_unknown_keys(config, overrides)
        if multirun:
            composer.check_points(config, overrides)


def check_sweep_points(config: DictConfig) -> None:
    """Every point of the sweep whose config Hydra composed (the sweep's callback, before its parent run): its
    keys are the schema's, its values of the schema's types, its `_target_`s take the arguments it gives them."""
    # The user's config directories (hydra.searchpath, among Hydra's own overrides) are needed to compose a point.
    lines = [*searchpath_overrides(config.hydra), *config.hydra.overrides.task]
    overrides = OverridesParser.create().parse_overrides(lines)
    refuse_unknown_keys(config, overrides)
    composer = _Composer(str(config.hydra.job.config_name or CONFIG_NAME))
    composer.check_points(config, overrides)


def _changed(config: DictConfig, line: str) -> DictConfig | None:
    """`config` with the key=value of `line` set on a copy (a fraction of a composition); None where the config
    refuses it."""
    other = copy.deepcopy(config)
    [parsed] = OverridesParser.create().parse_overrides([line])
    try:
        OmegaConf.update(other, parsed.key_or_group, parsed.value(), merge=True)
    except OmegaConfBaseException:
        return None
    return other


def _values(override: Override) -> list[str]:
    """Each value of an override as an override of its own; none for a range a sweeper samples from (optuna's
    interval), which no list can cover."""
    if not override.is_sweep_override():
        return [str(override.input_line)]
    if not override.is_discrete_sweep():
        return []
    return [f"{override.get_key_element()}={value}" for value in override.sweep_string_iterator()]


class _Composer:
    """Hydra's compose (inside an initialized Hydra), its refusals turned into the runner's paragraphs."""

    def __init__(self, config_name: str):
        self.config_name = config_name

    def parse(self, arguments: Sequence[str]) -> list[Override]:
        parser = OverridesParser.create()
        for argument in arguments:  # one at a time, to name the one Hydra cannot read
            try:
                parser.parse_overrides([argument])
            except HydraException as error:
                reason = " ".join(str(error).split())
                raise RunnerError(
                    f"{argument!r} is not valid: Hydra cannot read it as an override ({reason}). Fix: write "
                    "key=value (group=option for a config group, +key=value to add a key); quote a value that "
                    "holds spaces, commas or brackets, e.g. 'mlflow.run_name=\"my run\"'."
                ) from None
        return parser.parse_overrides(list(arguments))

    def _compose(self, overrides: Sequence[str], return_hydra_config: bool = False) -> DictConfig:
        return compose(self.config_name, list(overrides), return_hydra_config=return_hydra_config)

    def compose(self, overrides: Sequence[str], return_hydra_config: bool = False) -> DictConfig:
        try:
            return self._compose(overrides, return_hydra_config)
        except COMPOSITION_ERRORS:
            failing = self._first_failing(overrides)
            if failing is None:
                raise
            index, error = failing
            raise self._paragraph(overrides[index], overrides[:index], error) from None

    def check_points(self, config: DictConfig, overrides: list[Override]) -> None:
        """Each value of each swept key, in the config of the point that differs from `config` in it (Hydra's sweep
        config holds none of the swept values)."""
        points = [_values(override) for override in overrides]
        job = job_config(config)  # without the hydra node, which no value of a job changes: copied per value
        _check_targets(job)
        check_named_metrics(job)
        for index, override in enumerate(overrides):
            if not override.is_sweep_override():
                continue
            picks_an_option = override.is_add() or bool(_loader().get_group_options(override.key_or_group))
            for value in points[index]:
                other = None if picks_an_option else _changed(job, value)
                if other is None:  # an option of a group, or a value the config refuses: composing names it
                    point = [value if at == index else chosen[0] for at, chosen in enumerate(points) if chosen]
                    other = self.compose(point)
                refuse_unknown_keys(other, overrides)
                _check_targets(other)
                check_named_metrics(other)

    def _first_failing(self, overrides: Sequence[str]) -> tuple[int, Exception] | None:
        """The first override whose addition makes the composition fail (and its error), by bisection."""
        low, high, error = 0, len(overrides), None  # overrides[:low] composes; overrides[:high] fails
        try:
            self._compose(overrides)
            return None
        except COMPOSITION_ERRORS as failure:
            error = failure
        while high - low > 1:
            middle = (low + high) // 2
            try:
                self._compose(overrides[:middle])
                low = middle
            except COMPOSITION_ERRORS as failure:
                high, error = middle, failure
        if high == 1:
            try:
                self._compose([])
            except COMPOSITION_ERRORS:  # the config fails without any override: not the command line's
                return None
        return high - 1, error

    def _paragraph(self, line: str, before: Sequence[str], error: Exception) -> RunnerError:
        [override] = OverridesParser.create().parse_overrides([line])
        key = override.key_or_group
        cause = error.__cause__
        message = str(error)
        if isinstance(error, MissingConfigException) or "Could not find '" in message:
            return self._missing_option(override, message, before)
        yaml_error = _yaml_error(error)
        if yaml_error is not None:
            return RunnerError(f"{line} is not valid: {yaml_error}", key=key)
        base = self._compose(before, return_hydra_config=key.startswith("hydra."))
        if (
            isinstance(cause, (ConfigAttributeError, ConfigKeyError))
            or message.startswith(("Could not override", "Could not delete from config. '"))
            or "config group '" in message
        ):
            if override.is_delete() and OmegaConf.select(base, key, default=_ABSENT) is None:
                return _null_key_deleted(line, key)
            return unknown_key(line, key, base, self._groups(before))
        if message.startswith("Could not append to config. An item is already at"):
            return RunnerError(
                f"{line} is not valid: {key} is already a key of the config, and + adds a new one. "
                f"Fix: write {line.lstrip('+')} (without +).",
                key=key,
            )
        if isinstance(cause, ValidationError):
            return self._wrong_type(override, line, before, cause)
        reason = " ".join((str(cause or error).splitlines() or [type(error).__name__])[0].split())
        return RunnerError(
            f"{line} is not valid: {reason}. Fix: correct it ({_SEE_KEYS}; python -m runner --help "
            "lists the config groups and their options).",
            key=key,
        )

    def _groups(self, overrides: Sequence[str]) -> list[str]:
        """The config groups a user can pick an option of, their own (hydra.searchpath) included."""
        return group_names(self.config_name, _searchpath_overrides(overrides))

    def _missing_option(self, override: Override, message: str, before: Sequence[str]) -> RunnerError:
        group, option = override.key_or_group, override.value()
        options = group_options(group, self.config_name, _searchpath_overrides([*before, str(override.input_line)]))
        if not options or not isinstance(option, str):
            lines = [line.strip() for line in message.splitlines() if line.strip()] or ["Hydra cannot find it"]
            first = next((line for line in lines if "Could not find" in line), lines[0])
            return RunnerError(
                f"{override.input_line} is not valid: {first}. Fix: pick an option of a "
                "config group (python -m runner --help lists them).",
                key=group,
            )
        close = difflib.get_close_matches(option, options, n=1, cutoff=_CLOSE)
        return RunnerError(
            f"{override.input_line} is not valid: the {group} group has no option {option!r}"
            + (f" (did you mean {group}={close[0]}?)" if close else "")
            + f"; its options are {', '.join(options)}. Fix: pick one of them, e.g. {group}={(close or options)[0]}.",
            key=group,
        )

    def _wrong_type(self, override: Override, line: str, before: Sequence[str], cause: Exception) -> RunnerError:
        """The paragraph runner.config.settings gives for the value, else OmegaConf's reason."""
        for overrides in (before, ()):
            try:
                config = as_dict(self._compose(overrides))
            except COMPOSITION_ERRORS:
                continue
            refused = settings_refusal(config, override)
            if refused is not None:
                return refused
        reason = " ".join(str(cause).splitlines()[0].split())
        return RunnerError(
            f"{line} is not valid: {reason}. Fix: give {override.key_or_group} a value of its type ({_SEE_KEYS}).",
            key=override.key_or_group,
        )


_ABSENT = object()


def _loader() -> Any:
    return GlobalHydra.instance().config_loader()


def _searchpath_overrides(overrides: Iterable[str]) -> list[str]:
    return [line for line in overrides if line.lstrip("+~").startswith("hydra.searchpath")]


def _yaml_error(error: BaseException) -> str | None:
    """A config file Hydra could not read as YAML: which file, which line and column, and what is wrong."""
    seen: BaseException | None = error
    while seen is not None and not isinstance(seen, yaml.MarkedYAMLError):
        seen = seen.__cause__ or seen.__context__
    if seen is None:
        return None
    mark = seen.context_mark or seen.problem_mark
    file = mark.name if mark is not None and mark.name.endswith((".yaml", ".yml")) else "a config file"
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = " ".join(f"{seen.context or ''} {seen.problem or ''}".split())
    return (
        f"the YAML of {file} cannot be read{where} ({problem}). Fix: correct that line of the file (a list is "
        "[a, b], a mapping {a: 1}; quote a value holding ':', '#', '[' or '{')."
    )


def _null_key_deleted(line: str, key: str) -> RunnerError:
    """`~dataset.dir` where dataset.dir is null: Hydra reads a null key as absent and refuses to delete it."""
    return RunnerError(
        f"{line} is not valid: {key} is already null, and Hydra deletes only a key that has a value. Fix: leave it "
        f"out: a null argument that a `_target_` callable does not take is not passed to it.",
        key=key,
    )


def settings_refusal(config: dict, override: Override) -> RunnerError | None:
    """What runner.config.settings says of `config` with the override's value set in it, if it is about that key."""
    config = copy.deepcopy(config)
    *parents, last = override.key_or_group.split(".")
    node: Any = config
    for parent in parents:
        if not isinstance(node, dict) or not isinstance(node.get(parent), dict):
            return None
        node = node[parent]
    if override.is_delete():
        node.pop(last, None)
    else:
        node[last] = override.value()
    for check in (validate, sweep_settings):
        try:
            check(config)
        except RunnerError as error:
            named, key = error.key or "", override.key_or_group
            if named == key or key.startswith(named + ".") or named.startswith(key + "."):
                return error
            return None
    return None


# The runner's Optuna sweeper's settings (hparams_search=optuna): a grid sweep (Hydra's basic sweeper) has none.
OPTUNA_SWEEPER_FILE = CONF_DIR / "hydra" / "sweeper" / "optuna.yaml"
# runner.sweeps.terms.SWEEPER_TARGET, which this layer may not import (lint-imports: sweeps sits above config).
_OPTUNA_SWEEPER = "hydra_plugins.runner_optuna_sweeper.OptunaSweeper"


def _optuna_sweeper_setting(line: str, key: str, plain: Mapping[str, Any]) -> RunnerError | None:
    """A setting of the Optuna sweeper (n_trials, terminate, ...) given to another sweeper: the paragraph that
    says so, or None."""
    name = key.removeprefix("hydra.sweeper.").partition(".")[0]
    if not key.startswith("hydra.sweeper.") or name not in yaml.safe_load(OPTUNA_SWEEPER_FILE.read_text()):
        return None
    hydra = plain.get("hydra")
    sweeper = hydra.get("sweeper") if isinstance(hydra, Mapping) else None
    target = sweeper.get("_target_") if isinstance(sweeper, Mapping) else None
    if target == _OPTUNA_SWEEPER:
        return None
    purpose = {
        "terminate": "a terminator ends an Optuna study once more trials could not be told from luckier ones",
        "n_trials": "n_trials is how many trials an Optuna study asks for",
    }.get(name, f"{name} is a setting of the runner's Optuna sweeper")
    return RunnerError(
        f"{line} is not valid with a grid sweep ({target or 'no Optuna sweeper'}): {purpose}, and a grid trains "
        "every point its values list, with no study to ask or stop. Fix: search with hparams_search=optuna "
        f"(python -m runner hparams_search=optuna {line} ...), or remove {line}.",
        key=key,
    )


def _check_targets(config: DictConfig) -> None:
    plain = {group: OmegaConf.to_container(config[group], resolve=True) for group in TARGET_GROUPS}
    check_targets(target_components(plain), TARGET_ARGUMENTS)


def schema_keys(config: Mapping[str, Any] | None = None, hydra: Mapping[str, Any] | None = None) -> list[str]:
    """Every dotted key of the schema (and of `config`'s open groups, and of a hydra node)."""
    keys = list(_declared_paths(Settings, ""))
    for group in OPEN_GROUPS:
        node = config.get(group) if config is not None else None
        if isinstance(node, Mapping):
            keys.extend(f"{group}.{key!s}" for key in node if f"{group}.{key!s}" not in keys)
    if hydra is not None:
        keys.extend(_paths(hydra, "hydra."))
    return keys


def _declared_paths(kind: type, prefix: str) -> Iterable[str]:
    for item in declared(kind):
        name = config_name(item)
        if "target" in item.metadata and prefix:
            continue  # dataset's and optimizer's callable: their keys are `_target_` and the arguments
        path = f"{prefix}{name}"
        yield path
        if "group" in item.metadata:
            yield from _declared_paths(group_class(kind, item), path + ".")


def _paths(node: Mapping[str, Any], prefix: str) -> Iterable[str]:
    for key, value in node.items():
        yield f"{prefix}{key!s}"
        if isinstance(value, Mapping):
            yield from _paths(value, f"{prefix}{key!s}.")


def unknown_keys(config: DictConfig | Mapping[str, Any]) -> list[str]:
    """The keys of a composed config that the schema does not have (`+batch_size=128` adds one: Hydra's `+`
    lifts OmegaConf's refusal), outside the open groups (the `_target_` groups, metrics) and the hydra node."""
    return [key for key in _paths(_unresolved(config), "") if not _declared(key)]


def _unresolved(config: DictConfig | Mapping[str, Any]) -> Mapping[str, Any]:
    """A config as plain mappings, its interpolations as written (hydra's refer to a job that does not exist yet)."""
    plain = OmegaConf.to_container(config, resolve=False) if isinstance(config, DictConfig) else config
    assert isinstance(plain, Mapping)
    return cast(Mapping[str, Any], plain)  # a composed config's names are strings


def _declared(path: str) -> bool:
    """Whether the schema declares `path` (or an open group or the hydra node holds it)."""
    first = path.split(".", 1)[0]
    return first == "hydra" or first in OPEN_GROUPS or path in _DECLARED


_DECLARED = frozenset(_declared_paths(Settings, ""))


def refuse_unknown_keys(config: DictConfig, overrides: Iterable[Override] = ()) -> None:
    """Raise the paragraph for the first key of `config` the schema does not have, naming the override that
    added it when there is one."""
    for key in unknown_keys(config):
        line = next(
            (
                str(override.input_line)
                for override in overrides
                if override.key_or_group == key or key.startswith(override.key_or_group + ".")
            ),
            key,
        )
        raise unknown_key(line, key, config)


def unknown_key(line: str, key: str, config: Any, groups: Sequence[str] = ()) -> RunnerError:
    """`key` (given as `line` on the command line) is not a key of the config: one paragraph with the
    closest key that is, or, for a top-level name like none of them, the config groups."""
    plain = _unresolved(config)
    optuna_only = _optuna_sweeper_setting(line, key, plain)
    if optuna_only is not None:
        return optuna_only
    hydra = plain.get("hydra") if key.startswith("hydra.") else None
    candidates = [path for path in schema_keys(plain, hydra if isinstance(hydra, Mapping) else None) if path != key]
    parent = key.rpartition(".")[0]
    siblings = [path for path in candidates if path.rpartition(".")[0] == parent]
    close = difflib.get_close_matches(key, siblings, n=1, cutoff=_CLOSE) or difflib.get_close_matches(
        key, candidates, n=1, cutoff=_CLOSE
    )
    value = line.partition("=")[2] if "=" in line else None  # the override as typed, after its key
    if close:
        fix = f"use {close[0]}" + (f"={value}" if value is not None else "")
    elif groups and "." not in key:
        fix = f"remove {line}, or pick an option of one of the config groups: {', '.join(groups)}"
    else:
        fix = f"remove {line}"
    return RunnerError(
        f"{line} is not valid: the config has no key {key!r}"
        + (f" (did you mean {close[0]}?)" if close else "")
        + f". Fix: {fix} ({_SEE_KEYS}; a model, optimizer, schedule, loss or dataset takes its callable's "
        "arguments as keys).",
        key=key,
    )
