"""Every config group option composes and validates; bad values are rejected with the fix."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from helpers.config import CONF, compose, overridden
from runner.config.settings import checked_targets, objective_of, validate
from runner.errors import RunnerError


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def _settings(*overrides: str):
    return validate(OmegaConf.to_container(compose(list(overrides)), resolve=True))


@pytest.fixture(scope="module")
def defaults() -> dict:
    return OmegaConf.to_container(compose([]), resolve=True)


# What an option needs besides itself: the multi-process strategies run on a cluster (test_cluster.py).
_NEEDS = {
    "strategy=multi_worker_mirrored": ["cluster=local"],
    "strategy=parameter_server": ["cluster=local", "loop.steps_per_epoch=10"],
}


@pytest.mark.parametrize(
    "group,option",
    [
        (group, option)
        for group in ("strategy", "dataset", "model", "optimizer", "schedule", "loss", "lr_scaling", "loop")
        for option in _options(group)
    ],
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
    elif group == "strategy":
        assert node.name == option
    elif group == "dataset":
        assert node.name == option and node.component.target.startswith("runner.data.")
    else:  # a `_target_` group: the option's callable, with the arguments it takes
        component = getattr(node, "component", node)
        assert component.target.rsplit(".", 1)[1] == option
        checked_targets(settings)


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
    assert (settings.mlflow.registered_model_name, settings.mlflow.register) == ("fashion_mnist", False)


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
        # Every key, empty, of the wrong type and out of range.
        ("batch=", "batch=''"),
        ("epochs=ten", "epochs='ten'"),
        ("epochs=1e9", "epochs=1000000000.0"),
        ("seed=-1", "seed=-1"),
        ("seed=4294967296", "seed=4294967296"),
        ("progress=", "progress=''"),
        ("progress=maybe", "progress='maybe'"),
        ("progress=1", "progress=1"),
        ("resume=", "resume=''"),
        ("resume=always", "resume='always'"),
        ("strategy.devices=", "strategy.devices=''"),
        ("strategy.devices=5", "strategy.devices=5"),
        ("strategy.devices=[]", "strategy.devices=[]"),
        ("strategy.cross_device_ops=", "strategy.cross_device_ops=''"),
        ("strategy.cpu_replicas=0", "strategy.cpu_replicas=0"),
        ("strategy.cpu_replicas=two", "strategy.cpu_replicas='two'"),
        ("strategy.tpu=5", "strategy.tpu=5"),
        ("strategy.communication=", "strategy.communication=''"),
        ("strategy.variable_partitioner=5", "strategy.variable_partitioner=5"),
        ("strategy.variable_partitioner.max_shards=0", "strategy.variable_partitioner.max_shards=0"),
        ("strategy.variable_partitioner.min_shard_bytes=", "strategy.variable_partitioner.min_shard_bytes=''"),
        ("cluster.kind=", "cluster.kind=''"),
        ("cluster.workers=0", "cluster.workers=0"),
        ("cluster.ps=", "cluster.ps=''"),
        ("cluster.timeout_seconds=0", "cluster.timeout_seconds=0"),
        ("cluster.timeout_seconds=nan", "cluster.timeout_seconds=nan"),
        ("cluster.port_base=0", "cluster.port_base=0"),
        ("cluster.port_base=70000", "cluster.port_base=70000"),
        ("dataset.dir=", "dataset.dir=''"),
        ("dataset.dir=5", "dataset.dir=5"),
        ("dataset.test_examples=-1", "dataset.test_examples=-1"),
        ("dataset.train_examples=many", "dataset.train_examples='many'"),
        ("dataset.validation_fraction=1.5", "dataset.validation_fraction=1.5"),
        ("dataset.validation_fraction=0", "dataset.validation_fraction=0"),
        ("dataset.validation_fraction=1", "dataset.validation_fraction=1"),
        ("dataset.validation_fraction=-0.1", "dataset.validation_fraction=-0.1"),
        ("dataset.validation_fraction=some", "dataset.validation_fraction='some'"),
        ("dataset.validation_fraction=true", "dataset.validation_fraction=True"),
        ("dataset.split_seed=-1", "dataset.split_seed=-1"),
        ("dataset.folds=1", "dataset.folds=1"),
        ("dataset.fold=-1", "dataset.fold=-1"),
        ("model.weight_decay=-1", "model.weight_decay=-1"),
        ("model.weight_decay=nan", "model.weight_decay=nan"),
        ("model.weight_decay=", "model.weight_decay=''"),
        ("optimizer.lr=0", "optimizer.lr=0"),
        ("optimizer.lr=inf", "optimizer.lr=inf"),
        ("optimizer.lr=", "optimizer.lr=''"),
        ("lr_scaling.rule=cubic", "lr_scaling.rule='cubic'"),
        ("lr_scaling.base_batch=", "lr_scaling.base_batch=''"),
        ("lr_scaling.warmup_epochs=-1", "lr_scaling.warmup_epochs=-1"),
        ("lr_scaling.warmup_epochs=inf", "lr_scaling.warmup_epochs=inf"),
        ("loop.style=", "loop=''"),
        ("loop.steps_per_epoch=", "loop.steps_per_epoch=''"),
        ("loop.steps_per_call=", "loop.steps_per_call=''"),
        ("checkpoint.every_epochs=0", "checkpoint.every_epochs=0"),
        ("checkpoint.every_epochs=", "checkpoint.every_epochs=''"),
        ("checkpoint.max_to_keep=0", "checkpoint.max_to_keep=0"),
        ("checkpoint=5", "checkpoint=5"),
        ("runtime.jit_compile=", "runtime.jit_compile=''"),
        ("runtime.jit_compile=yes", "runtime.jit_compile='yes'"),
        ("runtime.mixed_precision=", "runtime.mixed_precision=''"),
        ("runtime.mixed_precision=float64", "runtime.mixed_precision='float64'"),
        ("mlflow.experiment_name=", "mlflow.experiment_name=''"),
        ("mlflow.experiment_name=null", "mlflow.experiment_name=None"),
        ("mlflow.experiment_name=[a,b]", "mlflow.experiment_name=['a', 'b']"),
        ("mlflow.tracking_uri=5", "mlflow.tracking_uri='5'"),
        ("mlflow.tracking_uri=./mlruns", "mlflow.tracking_uri='./mlruns'"),
        ("mlflow.run_name=[a]", "mlflow.run_name=['a']"),
        ("mlflow=5", "mlflow=5"),
        ("~batch", "batch=None"),
        ("runtime.deterministic=maybe", "runtime.deterministic='maybe'"),
        ("runtime.deterministic=1", "runtime.deterministic=1"),
        ("runtime.deterministic=null", "runtime.deterministic=None"),
        ("runtime.keras=4", "runtime.keras=4"),
        ("runtime.keras=three", "runtime.keras='three'"),
        ("runtime.keras=", "runtime.keras=''"),
        ("runtime.keras=null", "runtime.keras=None"),
        ("mlflow.register=yes", "mlflow.register='yes'"),
        ("mlflow.register=1", "mlflow.register=1"),
        ("mlflow.log_model=maybe", "mlflow.log_model='maybe'"),
        ("mlflow.registered_model_name=''", "mlflow.registered_model_name=''"),
        ("mlflow.registered_model_name=a/b", "mlflow.registered_model_name='a/b'"),
        ("mlflow.system_metrics.enabled=maybe", "mlflow.system_metrics.enabled='maybe'"),
        ("mlflow.system_metrics.enabled=null", "mlflow.system_metrics.enabled=None"),
        ("mlflow.system_metrics.interval_seconds=0", "mlflow.system_metrics.interval_seconds=0"),
        ("mlflow.system_metrics.interval_seconds=often", "mlflow.system_metrics.interval_seconds='often'"),
        ("mlflow.system_metrics.interval_seconds=nan", "mlflow.system_metrics.interval_seconds=nan"),
        ("mlflow.system_metrics=5", "mlflow.system_metrics=5"),
        ("mlflow.checkpoints=some", "mlflow.checkpoints='some'"),
        ("mlflow.checkpoints=", "mlflow.checkpoints=''"),
        ("mlflow.checkpoints=null", "mlflow.checkpoints=None"),
        ("mlflow.checkpoints=[last]", "mlflow.checkpoints=['last']"),
        ("mlflow.outage_seconds=-1", "mlflow.outage_seconds=-1"),
        ("mlflow.outage_seconds=forever", "mlflow.outage_seconds='forever'"),
        ("mlflow.tracking_uri=http://alice:s3cret@127.0.0.1:5000", "mlflow.tracking_uri='http://***@127.0.0.1:5000'"),
        (
            "mlflow.tracking_uri=postgresql+psycopg2://alice:s3cret@127.0.0.1/db",
            "mlflow.tracking_uri='postgresql+psycopg2://***@127.0.0.1/db'",
        ),
        ("verbose=", "verbose=''"),
        ("verbose=loud", "verbose='loud'"),
        ("sweep.seeds=0", "sweep.seeds=0"),
        ("sweep.seeds=two", "sweep.seeds='two'"),
        ("sweep.seeds=1.5", "sweep.seeds=1.5"),
    ],
)
def test_bad_values_name_the_value_and_the_fix(defaults, override, named):
    with pytest.raises(RunnerError) as raised:
        validate(overridden(defaults, override))
    message = str(raised.value)
    assert message.startswith(named + " is not valid"), message
    assert "Fix:" in message and "\n" not in message
    assert "s3cret" not in message and "alice" not in message


def test_a_run_logs_its_model_unless_told_not_to_and_cannot_register_without_it():
    assert _settings().mlflow.log_model is True
    assert _settings("mlflow.log_model=false").mlflow.log_model is False
    with pytest.raises(
        RunnerError, match=r"^mlflow.register=True is not valid: it needs the run's model, and mlflow.log_model=false"
    ):
        _settings("mlflow.register=true", "mlflow.log_model=false")


def test_the_mlflow_run_keeps_the_last_checkpoint_unless_told_otherwise():
    assert _settings().mlflow.checkpoints == "last"
    assert [_settings(f"mlflow.checkpoints={choice}").mlflow.checkpoints for choice in ("all", "none", "last")] == [
        "all",
        "none",
        "last",
    ]
    with pytest.raises(
        RunnerError, match=r"^mlflow.checkpoints='some' is not valid: the options are last, all, none\."
    ):
        _settings("mlflow.checkpoints=some")


def test_system_metrics_are_on_every_ten_seconds_unless_turned_off():
    assert (_settings().mlflow.system_metrics.enabled, _settings().mlflow.system_metrics.interval_seconds) == (True, 10)
    assert not _settings("mlflow.system_metrics.enabled=false").mlflow.system_metrics.enabled
    assert _settings("mlflow.system_metrics.interval_seconds=0.5").mlflow.system_metrics.interval_seconds == 0.5


@pytest.mark.parametrize("strategy", ["default", "one_device", "tpu", "multi_worker_mirrored", "parameter_server"])
def test_cpu_replicas_is_refused_where_it_cannot_apply(strategy):
    with pytest.raises(RunnerError, match=rf"strategy={strategy} cannot use several CPU replicas.*strategy=mirrored"):
        _settings(f"strategy={strategy}", "strategy.cpu_replicas=2")


def test_cpu_replicas_and_explicit_devices_conflict():
    with pytest.raises(RunnerError, match="either strategy.devices or strategy.cpu_replicas"):
        _settings("strategy.cpu_replicas=2", "strategy.devices=[/cpu:0]")


@pytest.mark.parametrize(
    "override,named",
    [
        ("sweep=5", "sweep=5"),
        ("sweep.objective=", "sweep.objective=''"),
        ("sweep.objective=speed", "sweep.objective='speed'"),
        ("sweep.folds=1", "sweep.folds=1"),
        ("sweep.folds=0", "sweep.folds=0"),
        ("sweep.folds=two", "sweep.folds='two'"),
        ("sweep.trial_models=best", "sweep.trial_models='best'"),
        # The exported model's size is measured as the model is logged: not for a trial that logs none.
        ("sweep.objective=model_bytes,sweep.trial_models=champion", "sweep.objective=model_bytes"),
    ],
)
def test_bad_sweep_settings_name_the_value_and_the_fix(defaults, override, named):
    config = defaults
    for item in override.split(","):
        config = overridden(config, item)
    with pytest.raises(RunnerError) as raised:
        objective_of(config)
    message = str(raised.value)
    assert message.startswith(named + " is not valid") and "Fix:" in message and "\n" not in message, message


def test_a_sweep_may_choose_on_what_a_model_costs_and_on_its_size_only_where_each_run_logs_its_model():
    assert _settings("sweep.objective=parameters").sweep.objective == "parameters"
    assert _settings("sweep.objective=model_bytes").sweep.objective == "model_bytes"
    with pytest.raises(RunnerError, match=r"^sweep.objective=model_bytes is not valid: .*mlflow.log_model=false.* Fix"):
        _settings("sweep.objective=model_bytes", "mlflow.log_model=false")


@pytest.mark.parametrize(
    "override,expected",
    [
        ("mlflow.tracking_uri=", None),
        ("mlflow.tracking_uri=postgresql+psycopg2://u@127.0.0.1/db", None),
        ("mlflow.run_name=", None),
        ("mlflow.experiment_name=2024", "2024"),
        ("strategy.tpu=", ""),
    ],
)
def test_empty_and_numeric_values_where_they_mean_something(override, expected):
    settings = _settings(override)
    key = override.split("=")[0]
    value = {
        "mlflow.tracking_uri": settings.mlflow.tracking_uri,
        "mlflow.run_name": settings.mlflow.run_name,
        "mlflow.experiment_name": settings.mlflow.experiment_name,
        "strategy.tpu": settings.strategy.tpu,
    }[key]
    if key == "mlflow.tracking_uri" and override.endswith("db"):
        expected = override.split("=", 1)[1]
    assert value == expected


def _ray_launcher(*dotlist: str, environ=None):
    from omegaconf import OmegaConf

    from runner.sweeps.launch.ray_launcher import ray_launcher

    config = OmegaConf.merge(
        OmegaConf.load(CONF / "hydra" / "launcher" / "ray.yaml"),
        OmegaConf.from_dotlist([f"ray.{item}" for item in dotlist]),
    )
    return ray_launcher(config.ray, environ or {})


@pytest.mark.parametrize(
    "overrides,environ,head",
    [
        ((), {}, None),
        (("init.address=local",), {"RAY_ADDRESS": "10.0.0.5:6379"}, None),
        (("init.address=auto",), {}, None),
        (("init.address=10.0.0.5:6379",), {}, ("10.0.0.5", 6379)),
        (("init.address=ray://head:10001",), {}, ("head", 10001)),
        ((), {"RAY_ADDRESS": "head:6380"}, ("head", 6380)),
        (("init.address=local", "init.num_cpus=2", "init.object_store_memory=100000000"), {}, None),
        (("remote.num_cpus=0.5", "remote.num_gpus=1"), {}, None),
    ],
)
def test_ray_launcher_settings_find_the_cluster_to_reach(overrides, environ, head):
    assert _ray_launcher(*overrides, environ=environ).head == head


@pytest.mark.parametrize(
    "overrides,environ,named",
    [
        (("init.address=''",), {}, "hydra.launcher.ray.init.address=''"),
        (("init.address=headnode",), {}, "hydra.launcher.ray.init.address='headnode'"),
        (("init.address=head:port",), {}, "hydra.launcher.ray.init.address='head:port'"),
        (("init.address=head:70000",), {}, "hydra.launcher.ray.init.address='head:70000'"),
        ((), {"RAY_ADDRESS": "head"}, "RAY_ADDRESS='head'"),
        (
            ("init.address=head:6379", "init.object_store_memory=100000000"),
            {},
            "hydra.launcher.ray.init.object_store_memory=100000000",
        ),
        (("init.address=head:6379", "init.num_cpus=2"), {}, "hydra.launcher.ray.init.num_cpus=2"),
        (("remote.num_cpus=-1",), {}, "hydra.launcher.ray.remote.num_cpus=-1"),
        (("remote.num_gpus=one",), {}, "hydra.launcher.ray.remote.num_gpus='one'"),
    ],
)
def test_bad_ray_launcher_values_name_the_value_and_the_fix(overrides, environ, named):
    with pytest.raises(RunnerError) as raised:
        _ray_launcher(*overrides, environ=environ)
    message = str(raised.value)
    assert message.startswith(named + " is not valid"), message
    assert "Fix:" in message and "\n" not in message


def test_deterministic_refuses_asynchronous_parameter_servers():
    with pytest.raises(
        RunnerError,
        match=r"^runtime.deterministic=True is not valid: strategy=parameter_server "
        r"trains asynchronously.*Fix: use strategy=multi_worker_mirrored",
    ):
        _settings("strategy=parameter_server", "cluster=local", "loop.steps_per_epoch=10", "runtime.deterministic=true")
    settings = _settings("strategy=multi_worker_mirrored", "cluster=local", "runtime.deterministic=true")
    assert settings.runtime.deterministic
    assert not _settings().runtime.deterministic


@pytest.mark.parametrize(
    ("strategy", "extra", "upstream"),
    [
        ("multi_worker_mirrored", ["cluster=local"], "keras #20585"),
        ("parameter_server", ["cluster=local", "loop.steps_per_epoch=10"], "keras #18624"),
        ("central_storage", [], "CentralStorageStrategy"),
        ("tpu", [], "keras #19448"),
    ],
)
def test_keras3_builtin_models_are_refused_where_keras3_does_not_train(strategy, extra, upstream):
    with pytest.raises(RunnerError) as raised:
        _settings(f"strategy={strategy}", *extra, "runtime.keras=3")
    message = str(raised.value)
    assert message.startswith(f"runtime.keras=3 is not valid: strategy={strategy} cannot train a Keras 3 model")
    assert upstream in message and "Fix: use runtime.keras=2" in message and "\n" not in message
    assert raised.value.key == "runtime.keras"
    assert _settings(f"strategy={strategy}", *extra).runtime.keras == 2
    for supported in ("default", "one_device", "mirrored"):
        assert _settings(f"strategy={supported}", "runtime.keras=3").runtime.keras == 3


def test_tracking_uris_of_installed_store_plugins_are_accepted(defaults, tmp_path, monkeypatch):
    """A package that registers a tracking store under MLflow's `mlflow.tracking_store` entry point group."""
    dist = tmp_path / "acme_mlflow_store-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-mlflow-store\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[mlflow.tracking_store]\nacme = acme_mlflow_store:AcmeStore\n")
    config = overridden(defaults, "mlflow.tracking_uri=acme://tracking.example/team")
    with pytest.raises(RunnerError, match="schemes: sqlite"):
        validate(config)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert validate(config).mlflow.tracking_uri == "acme://tracking.example/team"
