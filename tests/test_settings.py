"""Every config group option composes and validates; bad values are rejected with the fix."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from conftest import CONF, compose
from runner.errors import RunnerError
from runner.settings import from_config


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def _settings(*overrides: str):
    return from_config(OmegaConf.to_container(compose(list(overrides)), resolve=True))


# What an option needs besides itself: the multi-process strategies run on a cluster (test_cluster.py).
_NEEDS = {
    "strategy=multi_worker_mirrored": ["cluster=local"],
    "strategy=parameter_server": ["cluster=local", "loop.steps_per_epoch=10"],
}


@pytest.mark.parametrize(
    "group,option",
    [(group, option) for group in ("strategy", "dataset", "model", "optimizer", "lr_scaling", "loop")
     for option in _options(group)],
)
def test_every_group_option_composes_and_validates(group, option):
    settings = _settings(f"{group}={option}", *_NEEDS.get(f"{group}={option}", ()))
    node = getattr(settings, group)
    value = {"lr_scaling": getattr(node, "rule", None), "loop": getattr(node, "style", None)}.get(group, None)
    if group == "lr_scaling":
        assert value == ("linear" if option == "warmup" else option)
        assert (node.warmup_epochs > 0) == (option == "warmup")
    elif group == "loop":
        assert value == option
    else:
        assert node.name == option


def test_defaults_follow_the_tutorial():
    settings = _settings()
    assert settings.strategy.name == "mirrored"
    assert settings.loop.style == "for_in"
    assert settings.dataset.name == "fashion_mnist"
    assert (settings.batch, settings.epochs) == (64, 10)
    assert (settings.checkpoint.every_epochs, settings.checkpoint.max_to_keep) == (2, 3)
    assert (settings.optimizer.lr, settings.lr_scaling.base_batch) == (0.001, 64)
    assert settings.mlflow.experiment_name == "fashion_mnist"
    assert settings.mlflow.tracking_uri is None


@pytest.mark.parametrize("batch", [1, 7, 128, 4096])
def test_any_positive_batch_is_accepted(batch):
    assert _settings(f"batch={batch}").batch == batch


@pytest.mark.parametrize(
    "override,named",
    [
        ("batch=0", "batch=0"),
        ("batch=-3", "batch=-3"),
        ("batch=abc", "batch='abc'"),
        ("batch=2.5", "batch=2.5"),
        ("epochs=0", "epochs=0"),
        ("loop.steps_per_epoch=0", "loop.steps_per_epoch=0"),
        ("loop.steps_per_call=-1", "loop.steps_per_call=-1"),
        ("dataset.train_examples=0", "dataset.train_examples=0"),
        ("dataset.dir=/no/such/fashion-mnist", "dataset.dir='/no/such/fashion-mnist'"),
        ("strategy.cross_device_ops=magic", "strategy.cross_device_ops='magic'"),
        ("lr_scaling.base_batch=0", "lr_scaling.base_batch=0"),
        ("optimizer.lr=-1", "optimizer.lr=-1"),
    ],
)
def test_bad_values_name_the_value_and_the_fix(override, named):
    with pytest.raises(RunnerError) as raised:
        _settings(override)
    message = str(raised.value)
    assert message.startswith(named + " is not valid"), message
    assert "Fix:" in message and "\n" not in message


@pytest.mark.parametrize("strategy", ["default", "one_device", "tpu", "multi_worker_mirrored", "parameter_server"])
def test_cpu_replicas_is_refused_where_it_cannot_apply(strategy):
    with pytest.raises(RunnerError, match=rf"strategy={strategy} cannot use several CPU replicas.*strategy=mirrored"):
        _settings(f"strategy={strategy}", "strategy.cpu_replicas=2")


def test_cpu_replicas_and_explicit_devices_conflict():
    with pytest.raises(RunnerError, match="either strategy.devices or strategy.cpu_replicas"):
        _settings("strategy.cpu_replicas=2", "strategy.devices=[/cpu:0]")
