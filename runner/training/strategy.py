"""Builds any tf.distribute strategy from its settings, in one place.

Errors a user can cause (no TPU, a device split requested too late) surface as RunnerError with the
fix, in the spirit of Model Garden's distribute_utils. The multi-process strategies take the cluster
resolver of this process's task (runner.clusters.roles).
"""

from __future__ import annotations

import tensorflow as tf

from runner.builtins.keras_lane import version_of
from runner.compat.keras3 import unsupported
from runner.config.schema import StrategySettings
from runner.errors import RunnerError

_CROSS_DEVICE_OPS = {
    "nccl": tf.distribute.NcclAllReduce,
    "hierarchical_copy": tf.distribute.HierarchicalCopyAllReduce,
    "reduce_to_one": tf.distribute.ReductionToOneDevice,
}


def split_cpu(replicas: int) -> list[str]:
    """Split the first CPU into `replicas` logical devices and return their names.

    Must run before TensorFlow creates its first tensor; it cannot be undone in a process.
    """
    cpu = tf.config.list_physical_devices("CPU")[0]
    wanted = [tf.config.LogicalDeviceConfiguration() for _ in range(replicas)]
    try:
        tf.config.set_logical_device_configuration(cpu, wanted)
    except RuntimeError as error:
        current = len(tf.config.list_logical_devices("CPU"))
        if current != replicas:
            raise RunnerError(
                f"strategy.cpu_replicas={replicas} cannot be applied: TensorFlow was already initialised "
                f"in this process with {current} CPU device(s) ({error}). Fix: start a fresh process "
                "(python -m runner ... does); in a Hydra sweep over strategy.cpu_replicas each job "
                "runs in its own process."
            ) from None
    return [device.name for device in tf.config.list_logical_devices("CPU")]


def gpu_models() -> list[str]:
    """The model name of each GPU TensorFlow sees (empty on a machine without one)."""
    return [
        tf.config.experimental.get_device_details(gpu).get("device_name", gpu.name)
        for gpu in tf.config.list_physical_devices("GPU")
    ]


def check_devices(devices: tuple[str, ...]) -> None:
    """Every device strategy.devices names is one this machine has: TensorFlow would otherwise place a replica
    named /gpu:1 on the CPU without a word (soft placement), training replicas that share one device."""
    present = tf.config.list_logical_devices()
    have = {
        (device.device_type.upper(), tf.DeviceSpec.from_string(device.name).device_index or 0) for device in present
    }
    missing = []
    for name in devices:
        try:
            spec = tf.DeviceSpec.from_string(name)
        except ValueError as error:
            raise RunnerError(
                f"strategy.devices={list(devices)!r} is not valid: {name!r} is not a device name ({error}). "
                "Fix: name devices as TensorFlow does, e.g. 'strategy.devices=[/gpu:0,/gpu:1]', or pass "
                "strategy.devices=null to use every GPU (or the CPU)."
            ) from None
        if spec.job not in (None, "localhost"):  # another task's device: its own machine knows
            continue
        if ((spec.device_type or "").upper(), spec.device_index or 0) not in have:
            missing.append(name)
    if missing:
        seen = ", ".join(f"/{device_type.lower()}:{index}" for device_type, index in sorted(have))
        raise RunnerError(
            f"strategy.devices={list(devices)!r} is not valid: this machine has no {', '.join(missing)}; "
            f"TensorFlow sees {seen}. Fix: name devices it has (e.g. 'strategy.devices=[/cpu:0]'), pass "
            "strategy.devices=null to use every GPU (or the CPU), or strategy.cpu_replicas=N to split the CPU "
            "into N replicas."
        )


def _local_devices(settings: StrategySettings) -> list[str] | None:
    if settings.devices is not None:
        if settings.name in ("one_device", "mirrored", "central_storage"):  # the strategies that place replicas
            check_devices(settings.devices)
        return list(settings.devices)
    if settings.cpu_replicas is not None:
        # Listing *logical* devices would initialise the runtime and make the CPU split impossible.
        if tf.config.list_physical_devices("GPU"):
            return [d.name for d in tf.config.list_logical_devices("GPU")]
        return split_cpu(settings.cpu_replicas)
    return None


def _tpu_strategy(settings: StrategySettings) -> tf.distribute.Strategy:
    where = f"strategy.tpu={settings.tpu!r}" if settings.tpu else "a local TPU (strategy.tpu='')"
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=settings.tpu)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    # OSError: urllib's URLError when a TPU name cannot be looked up (outside Google Cloud, or a mistyped name).
    except (ValueError, RuntimeError, OSError, tf.errors.OpError) as error:
        looked_up = getattr(error, "reason", None) if isinstance(error, OSError) else None
        if looked_up is not None:
            error = f"looking the name up failed ({looked_up})"
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0].rstrip(".")
        raise RunnerError(
            f"strategy=tpu found no TPU at {where}: {reason}. This machine has no TPU that TensorFlow "
            "can reach. Fix: run on a TPU VM or pass strategy.tpu=<name or grpc://address>, or pick "
            "another strategy, e.g. strategy=mirrored (GPUs or CPU) or strategy=one_device."
        ) from None
    return tf.distribute.TPUStrategy(resolver)


def _multi_worker_mirrored(
    settings: StrategySettings, resolver, timeout_seconds: float | None
) -> tf.distribute.Strategy:
    if settings.communication == "nccl" and not tf.config.list_physical_devices("GPU"):
        raise RunnerError(
            "strategy.communication='nccl' is not valid on this machine: NCCL all-reduces between GPUs, and "
            "TensorFlow sees none. Fix: use strategy.communication=ring (or auto) on CPUs."
        )
    implementation = getattr(tf.distribute.experimental.CommunicationImplementation, settings.communication.upper())
    # A dead or frozen peer needs no timeout: the strategy starts TensorFlow's coordination service, whose
    # heartbeats find it within seconds and abort every pending collective. A timeout costs a thread per
    # all-reduce for that long (TensorFlow schedules the abort on a thread of its own that sleeps until
    # then), thousands at a few steps per second: only when the user asks for it.
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=implementation, timeout_seconds=timeout_seconds
    )
    return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver, communication_options=options)


def _parameter_server(settings: StrategySettings, resolver) -> tf.distribute.Strategy:
    partitioner = None
    if settings.variable_partitioner.max_shards is not None:
        partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
            min_shard_bytes=settings.variable_partitioner.min_shard_bytes,
            max_shards=settings.variable_partitioner.max_shards,
        )
    return tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)


def build_strategy(
    settings: StrategySettings, resolver=None, timeout_seconds: float | None = None
) -> tf.distribute.Strategy:
    """Create the strategy named by settings.name; the multi-process strategies need this task's
    cluster resolver, and MultiWorkerMirrored's all-reduces give up after timeout_seconds (None: never,
    a dead peer is found by TensorFlow's heartbeats)."""
    name = settings.name
    devices = _local_devices(settings)
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "one_device":
        device = devices[0] if devices else ("/gpu:0" if tf.config.list_logical_devices("GPU") else "/cpu:0")
        return tf.distribute.OneDeviceStrategy(device)
    if name == "mirrored":
        cross = _CROSS_DEVICE_OPS[settings.cross_device_ops]() if settings.cross_device_ops else None
        return tf.distribute.MirroredStrategy(devices=devices, cross_device_ops=cross)
    if name == "central_storage":
        return tf.distribute.experimental.CentralStorageStrategy(compute_devices=devices)
    if name == "tpu":
        return _tpu_strategy(settings)
    if resolver is None:
        raise RunnerError(
            f"strategy={name} needs a cluster of several processes, and this process is not part of one. "
            "Fix: add cluster=local to start one on this machine, or cluster=tf_config / cluster=slurm."
        )
    if name == "multi_worker_mirrored":
        return _multi_worker_mirrored(settings, resolver, timeout_seconds)
    return _parameter_server(settings, resolver)


def check_model_keras(strategy: str, model, target: str) -> None:
    """A Keras 3 model only under the strategies Keras 3 supports upstream (runner.compat.keras3): one paragraph
    naming the upstream issue and the fix, before any MLflow run exists."""
    if version_of(model) == 3:
        why = unsupported(strategy, target)
        if why is not None:
            raise RunnerError(why)
