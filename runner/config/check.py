"""The command line composed before Hydra runs it, each refusal one paragraph with the closest valid key or option.

Hydra's own refusals (`epoch=1`: "Could not override 'epoch'", `loop=multistep`: "Could not find
'loop/multistep'") end a command with exit 1 and no suggestion, and in a sweep only after the sweep's MLflow
parent run exists. Here every override, and every value of a swept one, is composed with Hydra's compose API
first; what Hydra or OmegaConf refuses becomes a RunnerError naming the key and what the user meant. A value of
the wrong type (`batch=abc`, refused by the schema's types) gets the paragraph runner.config.settings gives for it. A
sweep's `_target_` callables are checked against their signatures for each swept value too.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from runner.config.plain import as_dict
from runner.config.schema import TARGET_GROUPS, RunnerConfig
from runner.errors import RunnerError


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


def compose_config(
    overrides: Sequence[str] = (), return_hydra_config: bool = False, config_name: str = CONFIG_NAME
) -> DictConfig:
    """conf/config.yaml composed with `overrides`, as `python -m runner <overrides>` composes it."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="runner"):
        return compose(config_name, list(overrides), return_hydra_config=return_hydra_config)


def check_command_line(arguments: Sequence[str]) -> None:
    """Compose `python -m runner <arguments>` (each value of a swept override once) and raise a RunnerError
    for the first override Hydra or the schema refuses; with -m, also check each composition's `_target_`s."""
    from hydra import initialize_config_dir
    from hydra._internal.utils import get_args_parser
    from hydra.core.global_hydra import GlobalHydra

    try:
        options = get_args_parser().parse_args(list(arguments))
    except SystemExit:  # --version, or an option Hydra itself rejects with its usage line
        return
    if any(getattr(options, name, None) for name in _NOT_COMPOSED):
        return
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="runner"):
        composer = _Composer(GlobalHydra.instance().config_loader(), options.config_name or CONFIG_NAME)
        overrides = composer.parse(options.overrides)
        choices = [
            [override.input_line] if not override.is_sweep_override() else _sweep_values(override)
            for override in overrides
        ]
        first = [values[0] for values in choices if values]
        config = composer.compose(first, return_hydra_config=True)
        multirun = options.multirun or str(OmegaConf.select(config, "hydra.mode")) == "RunMode.MULTIRUN"
        swept = [override for override in overrides if override.is_sweep_override()]
        if swept and not multirun:
            line = swept[0].input_line
            raise RunnerError(
                f"{line} is not valid: it gives several values, which is a sweep, and this command trains one run. "
                f"Fix: add -m to train one run per value (python -m runner -m {line}), or write a list as "
                f"{swept[0].get_key_element()}=[{line.split('=', 1)[1]}] or a string as "
                f"{swept[0].get_key_element()}='{line.split('=', 1)[1]}'."
            )
        refuse_unknown_keys(config, overrides)
        if not multirun:
            return
        _check_targets(config)
        for index, values in enumerate(choices):
            for value in values[1:]:
                point = [value if position == index else chosen[0] for position, chosen in enumerate(choices) if chosen]
                other = composer.changed(config, overrides[index], value) or composer.compose(point)
                refuse_unknown_keys(other, overrides)
                _check_targets(other)


def _sweep_values(override) -> list[str]:
    """Each value of a swept override as an override of its own; none for a range the sweeper samples from
    (optuna's interval), which no list can cover."""
    if not override.is_discrete_sweep():
        return []
    return [f"{override.get_key_element()}={value}" for value in override.sweep_string_iterator()]


class _Composer:
    """Hydra's compose inside one initialize_config_dir, its refusals turned into the runner's paragraphs."""

    def __init__(self, loader, config_name: str):
        self.loader, self.config_name = loader, config_name

    def parse(self, arguments: Sequence[str]) -> list:
        from hydra.core.override_parser.overrides_parser import OverridesParser
        from hydra.errors import HydraException

        parser = OverridesParser.create(config_loader=self.loader)
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
        from hydra import compose

        return compose(self.config_name, list(overrides), return_hydra_config=return_hydra_config)

    def compose(self, overrides: Sequence[str], return_hydra_config: bool = False) -> DictConfig:
        try:
            return self._compose(overrides, return_hydra_config)
        except Exception:  # noqa: BLE001  (turned into a paragraph below, or re-raised)
            failing = self._first_failing(overrides)
            if failing is None:
                raise
            index, error = failing
            raise self._paragraph(overrides[index], overrides[:index], error) from None

    def changed(self, config: DictConfig, override, line: str) -> DictConfig | None:
        """`config` with a key's other value set (a fraction of a composition); None for a config group's option,
        or where setting it fails (composing then names the problem)."""
        from hydra._internal.config_loader_impl import ConfigLoaderImpl
        from hydra.core.override_parser.overrides_parser import OverridesParser

        if override.is_add() or self.loader.get_group_options(override.key_or_group):
            return None
        other = copy.deepcopy(config)
        try:
            ConfigLoaderImpl._apply_overrides_to_config(OverridesParser.create().parse_overrides([line]), other)
        except Exception:  # noqa: BLE001
            return None
        return other

    def _first_failing(self, overrides: Sequence[str]) -> tuple[int, Exception] | None:
        """The first override whose addition makes the composition fail (and its error), by bisection."""
        low, high, error = 0, len(overrides), None  # overrides[:low] composes; overrides[:high] fails
        try:
            self._compose(overrides)
            return None
        except Exception as failure:  # noqa: BLE001
            error = failure
        while high - low > 1:
            middle = (low + high) // 2
            try:
                self._compose(overrides[:middle])
                low = middle
            except Exception as failure:  # noqa: BLE001
                high, error = middle, failure
        if high == 1:
            try:
                self._compose([])
            except Exception:  # noqa: BLE001  (the config fails without any override: not the command line's)
                return None
        return high - 1, error

    def _paragraph(self, line: str, before: Sequence[str], error: Exception) -> RunnerError:
        from hydra.core.override_parser.overrides_parser import OverridesParser
        from hydra.errors import MissingConfigException
        from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

        [override] = OverridesParser.create(config_loader=self.loader).parse_overrides([line])
        key = override.key_or_group
        cause = error.__cause__
        message = str(error)
        if isinstance(error, MissingConfigException) or "Could not find '" in message:
            return self._missing_option(override, message)
        base = self._compose(before, return_hydra_config=key.startswith("hydra."))
        if (
            isinstance(cause, (ConfigAttributeError, ConfigKeyError))
            or message.startswith(("Could not override", "Could not delete from config. '"))
            or "config group '" in message
        ):
            return unknown_key(line, key, base)
        if message.startswith("Could not append to config. An item is already at"):
            return RunnerError(
                f"{line} is not valid: {key} is already a key of the config, and + adds a new one. "
                f"Fix: write {line.lstrip('+')} (without +)."
            )
        if isinstance(cause, ValidationError):
            return self._wrong_type(override, line, before, cause)
        reason = " ".join((str(cause or error).splitlines() or [type(error).__name__])[0].split())
        return RunnerError(
            f"{line} is not valid: {reason}. Fix: correct it ({_SEE_KEYS}; python -m runner --help "
            "lists the config groups and their options)."
        )

    def _missing_option(self, override, message: str) -> RunnerError:
        group, option = override.key_or_group, override.value()
        options = self.loader.get_group_options(group)
        if not options or not isinstance(option, str):
            lines = [line.strip() for line in message.splitlines() if line.strip()] or ["Hydra cannot find it"]
            first = next((line for line in lines if "Could not find" in line), lines[0])
            return RunnerError(
                f"{override.input_line} is not valid: {first}. Fix: pick an option of a "
                "config group (python -m runner --help lists them)."
            )
        close = difflib.get_close_matches(option, options, n=1)
        return RunnerError(
            f"{override.input_line} is not valid: the {group} group has no option {option!r}"
            + (f" (did you mean {group}={close[0]}?)" if close else "")
            + f"; its options are {', '.join(options)}. Fix: pick one of them, e.g. {group}={(close or options)[0]}."
        )

    def _wrong_type(self, override, line: str, before: Sequence[str], cause: Exception) -> RunnerError:
        """The paragraph runner.config.settings gives for the value, else OmegaConf's reason."""
        for overrides in (before, ()):
            try:
                config = as_dict(self._compose(overrides))
            except Exception:  # noqa: BLE001
                continue
            refused = settings_refusal(config, override)
            if refused is not None:
                return refused
        reason = " ".join(str(cause).splitlines()[0].split())
        return RunnerError(
            f"{line} is not valid: {reason}. Fix: give {override.key_or_group} a value of its type ({_SEE_KEYS})."
        )


def settings_refusal(config: dict, override) -> RunnerError | None:
    """What runner.config.settings says of `config` with the override's value set in it, if it is about that key."""
    from runner.config.settings import from_config
    from runner.sweeps.terms import objective_name

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
    for check in (from_config, objective_name):
        try:
            check(config)
        except RunnerError as error:
            named = str(error).split("=", 1)[0].split(" ", 1)[0]
            key = override.key_or_group
            if named == key or key.startswith(named + ".") or named.startswith(key + "."):
                return error
            return None
    return None


def _check_targets(config: DictConfig) -> None:
    from runner.config.components import check_targets
    from runner.config.settings import target_components

    plain = {group: OmegaConf.to_container(config[group], resolve=True) for group in TARGET_GROUPS}
    check_targets(target_components(plain))


_SCHEMA: DictConfig | None = None


def _schema() -> DictConfig:
    global _SCHEMA
    if _SCHEMA is None:
        _SCHEMA = OmegaConf.structured(RunnerConfig)
    return _SCHEMA


def schema_keys(config: DictConfig | None = None, hydra: bool = False) -> list[str]:
    """Every dotted key of the schema (and of `config`'s open groups and, with `hydra`, its hydra node)."""
    keys = list(_paths(_schema(), ""))
    if config is not None:
        for group in TARGET_GROUPS:
            node = config._get_node(group) if group in config else None
            if isinstance(node, DictConfig):
                keys.extend(f"{group}.{key!s}" for key in node.keys() if f"{group}.{key!s}" not in keys)
        hydra_node = config._get_node("hydra") if hydra and "hydra" in config else None
        if isinstance(hydra_node, DictConfig):
            keys.extend(_paths(hydra_node, "hydra."))
    return keys


def _paths(node: DictConfig, prefix: str) -> Iterator[str]:
    for key in node.keys():
        path = f"{prefix}{key!s}"
        yield path
        child = node._get_node(key)
        if (
            isinstance(child, DictConfig)
            and path not in TARGET_GROUPS
            and not child._is_missing()
            and not child._is_none()
        ):
            yield from _paths(child, path + ".")


def unknown_keys(config: DictConfig) -> list[str]:
    """The keys of a composed config that the schema does not have (`+batch_size=128` adds one: Hydra's `+`
    lifts OmegaConf's refusal), outside the open `_target_` groups and the hydra node."""
    found: list[str] = []

    def walk(node: DictConfig, reference: DictConfig, prefix: str) -> None:
        for key in node.keys():
            path = f"{prefix}{key!s}"
            if path == "hydra" or path in TARGET_GROUPS:
                continue
            if key not in reference.keys():  # (`in` is False for a key whose value is ??? in the schema)
                found.append(path)
                continue
            child, expected = node._get_node(key), reference._get_node(key)
            if (
                isinstance(child, DictConfig)
                and isinstance(expected, DictConfig)
                and not child._is_none()
                and not child._is_missing()
            ):
                walk(child, expected, path + ".")

    walk(config, _schema(), "")
    return found


def refuse_unknown_keys(config: DictConfig, overrides: Iterable = ()) -> None:
    """Raise the paragraph for the first key of `config` the schema does not have, naming the override that
    added it when there is one."""
    for key in unknown_keys(config):
        line = next(
            (
                override.input_line
                for override in overrides
                if override.key_or_group == key or key.startswith(override.key_or_group + ".")
            ),
            key,
        )
        raise unknown_key(line, key, config)


def unknown_key(line: str, key: str, config: DictConfig) -> RunnerError:
    """`key` (given as `line` on the command line) is not a key of the config: one paragraph with the
    closest key that is."""
    hydra = key.startswith("hydra.")
    candidates = [path for path in schema_keys(config, hydra=hydra) if path != key]
    parent = key.rpartition(".")[0]
    siblings = [path for path in candidates if path.rpartition(".")[0] == parent]
    close = difflib.get_close_matches(key, siblings, n=1) or difflib.get_close_matches(key, candidates, n=1)
    value = line.split("=", 1)[1] if "=" in line else None
    if close:
        fix = f"use {close[0]}" + (f"={value}" if value is not None else "")
    else:
        fix = f"remove {line}"
    return RunnerError(
        f"{line} is not valid: the config has no key {key!r}"
        + (f" (did you mean {close[0]}?)" if close else "")
        + f". Fix: {fix} ({_SEE_KEYS}; a model, optimizer, schedule, loss or dataset takes its callable's "
        "arguments as keys)."
    )
