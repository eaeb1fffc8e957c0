"""`_target_` callables from the config: imported, their arguments checked against their signatures, and
called, each failure one paragraph that names the config key and the fix.

Hydra's `instantiate` does the call; this module adds what a user needs to hear before it: a dotted path
that does not import, an argument the callable does not take (with the closest one it does), an argument it
needs that nobody gives. It imports no TensorFlow itself (a built-in's module imports TensorFlow only when
its callable runs), so the runner's own options are checked before TensorFlow loads.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

from hydra.utils import instantiate

from runner.errors import RunnerError

# What the runner passes a dataset callable when it takes them (what it passes the others is declared with each
# group in runner.config.schema: TARGET_ARGUMENTS).
DATASET_ARGUMENTS = ("seed", "train_examples", "test_examples", "task")


@dataclass(frozen=True)
class Component:
    """One `_target_` node of the config: the callable's dotted path and its own arguments."""

    group: str  # the config key: one of runner.config.schema.TARGET_GROUPS
    target: str
    arguments: Mapping[str, Any] = field(default_factory=dict)

    def resolve(self) -> Callable[..., Any]:
        return import_target(f"{self.group}._target_", self.target)

    def instantiate(self, **supplied: Any) -> Any:
        """Call the target with its arguments and the runner's (`supplied`), through Hydra's instantiate."""
        return instantiate({"_target_": self.target, **self.arguments}, **supplied)


# What each group's `_target_` names, as an example of a dotted path a fix can show (the group is the key's first
# part: metrics.prauc._target_ is a metric's).
_EXAMPLES = {
    "model": "mylab.models.mlp",
    "dataset": "mylab.data.digits",
    "metrics": "tf_keras.metrics.AUC",
    "optimizer": "runner.builtins.optimizers.adam",
    "loss": "runner.builtins.losses.mean_squared_error",
    "schedule": "runner.builtins.schedules.cosine",
    "pruner": "optuna.pruners.MedianPruner",
}


def import_target(key: str, path: Any) -> Callable[..., Any]:
    """The callable a dotted path names (module.attribute, attributes nested as a.b.C.method allowed)."""
    example = _EXAMPLES.get(key.partition(".")[0], "mylab.models.mlp")
    fix = (
        f"give {key} as the dotted path of a function or class that Python can import, e.g. "
        f"{key}={example}, with its package installed or its directory on PYTHONPATH"
    )
    if not isinstance(path, str) or not path.strip() or "." not in path:
        raise RunnerError(
            f"{key}={path!r} is not valid: it must be a dotted path module.callable. Fix: {fix}.", key=key
        )
    parts = path.split(".")
    error: BaseException | None = None
    for split in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:split])
        try:
            found: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as missing:
            # Only "this module does not exist" moves on to a shorter prefix; a module that exists but fails
            # on an import of its own is the user's bug, reported as such.
            if missing.name is not None and module_name.startswith(missing.name):
                error = missing
                continue
            raise RunnerError(
                f"{key}={path!r} could not be imported: importing {module_name} raised "
                f"ModuleNotFoundError: {missing}. Fix: install the missing package in this "
                "environment (and wherever the jobs run).",
                key=key,
            ) from None
        except Exception as failure:  # the user's module raised while it was imported
            raise RunnerError(
                f"{key}={path!r} could not be imported: importing {module_name} raised "
                f"{type(failure).__name__}: {failure}. Fix: correct that module.",
                key=key,
            ) from None
        try:
            for attribute in parts[split:]:
                found = getattr(found, attribute)
        except AttributeError:
            names = [name for name in dir(found) if not name.startswith("_")]
            close = difflib.get_close_matches(parts[split], names, n=1)
            hint = f" (did you mean {module_name}.{close[0]}?)" if close else ""
            raise RunnerError(
                f"{key}={path!r} is not valid: module {module_name} has no {parts[split]!r}{hint}. Fix: {fix}.",
                key=key,
            ) from None
        if not callable(found):
            raise RunnerError(
                f"{key}={path!r} is not valid: it names a {type(found).__name__}, not a function or class. Fix: {fix}.",
                key=key,
            )
        return found
    raise RunnerError(f"{key}={path!r} could not be imported: no module {parts[0]!r} ({error}). Fix: {fix}.", key=key)


def check_arguments(
    key: str,
    target: str,
    function: Callable[..., Any],
    given: Mapping[str, Any],
    supplied: Iterable[str] = (),
    positional: int = 0,
    complete: bool = True,
) -> dict[str, Any]:
    """The arguments of `given` that `function` takes: every other one is refused, except a null one, which is left
    out (a group option's `dir: null` under a `_target_` given on the command line); and (if `complete`) every
    argument it needs is given.

    `supplied`: the arguments the runner passes itself (input_shape, learning_rate, ...); `positional`: how
    many leading positional parameters the runner fills at call time (a loss's labels and logits)."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # a builtin without a signature: nothing to check against
        return dict(given)
    parameters = list(signature.parameters.values())[positional:]
    accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
    named = _named_parameters(parameters)
    supplied = tuple(supplied)
    group = key.rsplit(".", 1)[0]
    for name in supplied:
        if name not in named and not accepts_any:
            _refuse_missing_parameter(group, target, name, supplied, named)
    taken = _taken_arguments(group, target, given, supplied, named, accepts_any)
    if complete:
        _check_complete(group, target, given, supplied, named)
    return taken


def _named_parameters(parameters: Iterable[inspect.Parameter]) -> dict[str, inspect.Parameter]:
    """The parameters an argument can be given to by name."""
    return {
        p.name: p
        for p in parameters
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }


def _taken_arguments(
    group: str,
    target: str,
    given: Mapping[str, Any],
    supplied: tuple[str, ...],
    named: Mapping[str, inspect.Parameter],
    accepts_any: bool,
) -> dict[str, Any]:
    """The given arguments the callable takes, a null one it does not take left out; any other refused."""
    taken: dict[str, Any] = {}
    for name, value in given.items():
        if name in supplied:
            _refuse_supplied_argument(group, target, name)
        if name not in named and not accepts_any:
            if value is None:
                continue
            _refuse_unknown_argument(group, target, name, supplied, named)
        taken[name] = value
    return taken


def _refuse_supplied_argument(group: str, target: str, name: str) -> NoReturn:
    """The config gives an argument that the runner passes itself."""
    raise RunnerError(
        f"{group}.{name} is not valid: the runner passes {name} to {target} itself. "
        f"Fix: remove {group}.{name} from the config.",
        key=f"{group}.{name}",
    )


def _refuse_unknown_argument(
    group: str, target: str, name: str, supplied: tuple[str, ...], named: Mapping[str, inspect.Parameter]
) -> NoReturn:
    """The config gives an argument the callable takes no parameter for: the closest one it does take, if any."""
    close = difflib.get_close_matches(name, list(named), n=1)
    options = ", ".join(sorted(n for n in named if n not in supplied)) or "none"
    raise RunnerError(
        f"{group}.{name} is not valid: {target} takes no argument {name!r}"
        + (f" (did you mean {group}.{close[0]}?)" if close else "")
        + f"; its arguments are: {options}. Fix: "
        + (f"use {group}.{close[0]}" if close else f"remove {group}.{name}")
        + ".",
        key=f"{group}.{name}",
    )


def _check_complete(
    group: str,
    target: str,
    given: Mapping[str, Any],
    supplied: tuple[str, ...],
    named: Mapping[str, inspect.Parameter],
) -> None:
    """Every parameter without a default is given an argument, by the config or by the runner."""
    for name, parameter in named.items():
        if parameter.default is inspect.Parameter.empty and name not in given and name not in supplied:
            raise RunnerError(
                f"{group}.{name} is missing: {target} needs the argument {name!r}. Fix: add +{group}.{name}=<value> "
                "to the command, or to the config file of that option.",
                key=f"{group}.{name}",
            )


def _refuse_missing_parameter(
    group: str, target: str, name: str, supplied: tuple[str, ...], named: Mapping[str, Any]
) -> None:
    """The callable has no parameter for an argument the runner passes it (`shape` where `input_shape` is meant)."""
    unclaimed = [parameter for parameter in named if parameter not in supplied]
    close = difflib.get_close_matches(name, unclaimed, n=1, cutoff=0.3)
    passes = " and ".join(supplied)
    raise RunnerError(
        f"{group}._target_={target!r} is not valid: the runner calls a {group} callable with the keyword "
        f"argument{'s' if len(supplied) > 1 else ''} {passes}, and {target} has no parameter {name!r} (its "
        f"parameters: {', '.join(named) or 'none'}). Fix: "
        + (f"rename its parameter {close[0]} to {name}" if close else f"give it a parameter named {name}")
        + " (or take **kwargs).",
        key=f"{group}._target_",
    )


def call(key: str, target: str, build: Callable[[], Any]) -> Any:
    """Run `build` (a call of the user's callable), turning what it raises into one paragraph."""
    try:
        return build()
    except RunnerError:
        raise
    except Exception as error:
        cause = error.__cause__ if type(error).__name__ == "InstantiationException" and error.__cause__ else error
        if isinstance(cause, RunnerError):  # the callable's own paragraph (the runner's dataset kinds)
            raise cause from None
        message = " ".join(str(cause).split())
        if len(message) > 400:
            message = message[:400] + "..."
        raise RunnerError(
            f"{key}={target!r} raised {type(cause).__name__} when the runner called it: {message}. "
            "Fix: correct the callable or the arguments its config gives it."
        ) from None


# What the runner passes each group's callable itself: keyword arguments, and how many leading positional ones.
def check_targets(
    components: Iterable[Component], supplies: Mapping[str, tuple[tuple[str, ...], int]], complete: bool = True
) -> list[Component]:
    """Each component's callable imports and takes the arguments its config gives (and, if `complete`, is
    given every argument it needs): one paragraph otherwise. Returns them with the arguments that are passed.
    `supplies`: per group, the keyword arguments the runner passes and how many positional ones
    (runner.config.schema.TARGET_ARGUMENTS)."""
    checked = []
    for component in components:
        supplied, positional = supplies[component.group]
        arguments = check_arguments(
            f"{component.group}._target_",
            component.target,
            component.resolve(),
            component.arguments,
            supplied,
            positional,
            complete,
        )
        checked.append(Component(component.group, component.target, arguments))
    return checked
