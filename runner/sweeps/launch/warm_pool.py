"""Warm workers: a sweep job's runs trained in long-lived processes instead of a fresh `python -m runner` each.

A fresh process pays for Python, TensorFlow, MLflow, the runner and the tracker's start on every run: seconds a
small trial does not train. On the launchers whose jobs run in long-lived processes (basic: the sweep's own; joblib:
its workers; Ray: its worker processes, which Ray reuses from task to task), a job hands its runs to the pool of its
process instead: a warm worker (runner.warm_worker) that has imported all of that once trains
them one after another, each with a fresh Keras session, strategy, data pipeline, model and optimizer, seeded as
the run asks. The pool is Ray Tune's `reuse_actors` on one machine: a worker is a Trainable that rebuilds itself
from each trial's config.

What TensorFlow fixes for a whole process (WorkerKind: the logical CPU devices behind strategy.cpu_replicas, op
determinism) is a worker's identity, set by its first run: a run goes to an idle worker of its kind, or to a fresh
one. A worker is retired after a run that did not finish (its exit status not 0: a Python error, a refused config, a
stop), when it was killed (the OS's out-of-memory killer: its run FAILED with the signal that killed it, as for a
cold process), and when its resident memory grows past sweep.worker_memory_mb. The cluster strategies
(MultiWorkerMirrored, ParameterServer, TPU), cluster=local/tf_config/slurm, submitit's launchers (a process per
job) and sweep.warm_workers=false keep a process per run (worker_kind is None).

A worker's lifeline is its job's (runner.lifeline): once the sweep is gone it stops its run as on preemption
(KILLED, resumable) and exits; it also exits once its standard input closes, which happens when the job's process
ends, however it ends.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass

from runner.lifeline import sweep_process
from runner.strategy_kinds import STRATEGIES
from runner.sweeps.sweep_config import SweepConfig

log = logging.getLogger("runner")

# The strategies whose processes belong to a cluster: each run starts its own (and its cluster's).
# How long a retired worker may take to exit once its standard input closes, and a stopped run to save.
EXIT_SECONDS = 60.0
# Workers of one kind at most in the sweep's own process: one trains while the other ends its last run.
PER_KIND = 2


@dataclass(frozen=True)
class WorkerKind:
    """What TensorFlow fixes for a whole process, and so which runs a warm worker may train."""

    cpu_devices: int  # the logical CPU devices (strategy.cpu_replicas; 1 without a split)
    deterministic: bool  # runtime.deterministic: op determinism, on for the rest of the process once on


def worker_kind(config: SweepConfig) -> WorkerKind | None:
    """The kind of warm worker a job's runs may train in, or None: a fresh process per run (the key is off, a
    cluster trains the run, or the values are not a valid config: the training process refuses them as usual)."""
    strategy = STRATEGIES.get(str(config.job.strategy))  # as composed: a name no strategy has fails in a fresh process
    if not config.sweep.warm_workers or strategy is None or strategy.own_process:
        return None
    if config.job.cluster_kind not in (None, "none"):
        return None
    replicas, deterministic = config.job.cpu_replicas, config.job.deterministic
    if replicas is not None and (isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1):
        return None
    if not isinstance(deterministic, bool):
        return None
    return WorkerKind(replicas or 1, deterministic)


class WarmWorker:
    """One worker process and the two pipes to it: runs go in on its standard input, exit statuses come back."""

    def __init__(self, environ: dict[str, str]):
        read_end, write_end = os.pipe()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "runner.warm_worker", str(write_end)],
                stdin=subprocess.PIPE,
                pass_fds=(write_end,),
                env={**os.environ, **environ},
                text=True,
            )
        finally:
            os.close(write_end)
        self._replies = read_end  # read a byte at a time: select() then says exactly whether a reply waits
        self.kind: WorkerKind | None = None  # set by its first run
        self.runs = 0
        self.ending = False  # its last run has answered but not yet ended (wait_done)
        self._closed = False
        log.info("started warm training worker pid %d", self.process.pid)

    def train(self, arguments: list[str], cwd: str, environ: dict[str, str]) -> int:
        """Hand it one run; the run's exit status once its job may go on (0: its outcome is written, its model and
        MLflow run may still be ending: wait_done), or the worker's if it died meanwhile (-9: SIGKILL)."""
        assert self.process.stdin is not None
        self.ending = True
        try:
            self.process.stdin.write(json.dumps({"arguments": arguments, "cwd": cwd, "environ": environ}) + "\n")
            self.process.stdin.flush()
        except OSError:  # it died between two runs
            return self._died()
        reply = self._reply("answer")
        self.runs += 1
        return self._died() if reply is None else reply

    def wait_done(self, timeout: float | None = None) -> int | None:
        """Wait (at most `timeout` seconds) until its last run has ended; that run's final exit status (None: still
        ending). A worker that is not ending answers 0 at once."""
        if not self.ending:
            return 0
        if timeout is not None and not select.select([self._replies], [], [], timeout)[0]:
            return None
        reply = self._reply("done")
        self.ending = False
        return self._died() if reply is None else reply

    def _reply(self, kind: str) -> int | None:
        """The next reply's status (`kind`: answer or done); None once the worker is gone."""
        line = bytearray()
        while not line.endswith(b"\n"):
            byte = os.read(self._replies, 1)
            if not byte:
                return None
            line += byte
        return int(json.loads(line)[kind])

    def _died(self) -> int:
        self.ending = False
        return self.process.wait()

    def memory_mb(self) -> float:
        """Its resident memory in MiB (VmRSS), 0 where /proc cannot say."""
        try:
            with open(f"/proc/{self.process.pid}/status") as handle:
                for line in handle:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) / 1024
        except OSError:
            pass
        return 0.0

    def alive(self) -> bool:
        return self.process.poll() is None

    def let_go(self) -> None:
        """Close its standard input: it exits once its last run has ended (close waits for that)."""
        try:
            if self.process.stdin is not None:
                self.process.stdin.close()
        except OSError:
            pass

    def close(self) -> None:
        """Let it exit (its standard input closed), killing it if it does not in time."""
        if self._closed:
            return
        self._closed = True
        self.let_go()
        try:
            self.process.wait(timeout=EXIT_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._replies)

    def stop_for_resume(self) -> None:
        """Its run interrupted (the job was: Ctrl-C, a launcher's signal): SIGTERM, so that the run saves a checkpoint
        and ends KILLED and resumable, then close."""
        if self.alive():
            log.warning(
                "the sweep job was interrupted: stopping its warm training worker (pid %d) with SIGTERM so that its "
                "run saves a checkpoint and can be resumed",
                self.process.pid,
            )
            self.process.send_signal(signal.SIGTERM)
        self.close()


class WorkerPool:
    """The warm workers of one process (a job's: the sweep's own under the basic launcher, a joblib or Ray worker's).

    In the sweep's own process a run's ending (its model's export, its MLflow run's end) overlaps the next run, which
    takes another worker of its kind (at most PER_KIND of them, so two alternate); on_multirun_end waits for every
    ending (close) before the summary and the registry read the runs. Elsewhere (a joblib or Ray worker, whose jobs
    the sweep's process cannot wait for) a job returns once its run has ended."""

    def __init__(self) -> None:
        self._workers: list[WarmWorker] = []  # idle or ending; a worker training a run is out of the list
        self._lock = threading.Lock()

    def train(
        self,
        kind: WorkerKind,
        arguments: list[str],
        cwd: str,
        environ: dict[str, str],
        lifeline: dict[str, str],
        memory_limit_mb: int,
        to_the_end: bool = False,
    ) -> int:
        """Train one run in a worker of `kind` (idle, or fresh with `lifeline`); its exit status once the job may go on,
        or (`to_the_end`) once the run has ended, its model logged. A worker is kept for the next run only while its
        runs end with status 0 within memory_limit_mb."""
        with self._lock:
            worker = self._worker_for(kind, memory_limit_mb) or WarmWorker(lifeline)
        worker.kind = kind
        self._spare_ahead(kind, lifeline)
        try:
            code = worker.train(arguments, cwd, environ)
        except BaseException:
            worker.stop_for_resume()
            raise
        if code != 0:
            worker.close()
            return code
        if _overlaps_endings() and not to_the_end:
            with self._lock:
                self._workers.append(worker)
            return code
        ended = worker.wait_done()
        assert ended is not None, "without a timeout, wait_done waits for the run's end"
        if self._keeps(worker, ended, memory_limit_mb):
            with self._lock:
                self._workers.append(worker)
        return ended if to_the_end else code

    def _spare_ahead(self, kind: WorkerKind, lifeline: dict[str, str]) -> None:
        """Where runs' endings overlap the next run, a worker for that run starts importing while this one trains
        (until PER_KIND workers of `kind` exist), so that the next run does not wait for a fresh process."""
        with self._lock:
            spare = any(worker.kind is None for worker in self._workers)
            of_kind = 1 + sum(worker.kind == kind for worker in self._workers)
            if _overlaps_endings() and not spare and of_kind < PER_KIND:
                self._workers.append(WarmWorker(lifeline))

    def start_ahead(self, lifeline: dict[str, str]) -> None:
        """Start a worker for the first run now (the sweep's own process, as the sweep starts): it imports TensorFlow
        and the rest while the sweep creates its parent run and study. A sweep that trains nothing terminates it."""
        with self._lock:
            if not self._workers:
                self._workers.append(WarmWorker(lifeline))

    def settle(self, memory_limit_mb: int) -> None:
        """Wait for every run still ending (the sweep's summary reads them), keeping the workers that may train on."""
        with self._lock:
            workers, self._workers = self._workers, []
        kept = [worker for worker in workers if self._keeps(worker, worker.wait_done(), memory_limit_mb)]
        with self._lock:
            self._workers[:0] = kept

    def close(self) -> None:
        """Wait for every run still ending, then retire every worker (the sweep has ended)."""
        with self._lock:
            workers, self._workers = self._workers, []
        for worker in workers:
            if worker.kind is None:  # started ahead for a run that never came: it holds nothing
                worker.process.terminate()
        for worker in workers:  # every ending first, then every exit: the workers wind down side by side
            worker.wait_done()
            worker.let_go()
        for worker in workers:
            worker.close()

    def _worker_for(self, kind: WorkerKind, memory_limit_mb: int) -> WarmWorker | None:
        """An idle worker of `kind` (or of none yet), the first of its kind to end its run when PER_KIND of them are
        ending, or None: start a fresh one."""
        for worker in list(self._workers):  # the endings that are over: kept, or retired
            if worker.ending:
                code = worker.wait_done(timeout=0)
                if code is not None and not self._keeps(worker, code, memory_limit_mb):
                    self._workers.remove(worker)
        for wanted in (kind, None):
            idle = [worker for worker in self._workers if worker.kind == wanted and not worker.ending]
            if idle:
                self._workers.remove(idle[0])
                return idle[0]
        ending = [worker for worker in self._workers if worker.kind == kind]
        if len(ending) < PER_KIND:
            return None
        worker = ending[0]
        self._workers.remove(worker)
        return worker if self._keeps(worker, worker.wait_done(), memory_limit_mb) else None

    @staticmethod
    def _keeps(worker: WarmWorker, code: int | None, memory_limit_mb: int) -> bool:
        """Whether `worker`, whose run ended with `code`, may train another run (it is alive and within
        memory_limit_mb); retired otherwise."""
        if code == 0 and worker.alive():
            memory = worker.memory_mb()
            if memory <= memory_limit_mb:
                return True
            log.info(
                "warm training worker pid %d holds %.0f MiB after %d run(s), more than sweep.worker_memory_mb=%d: "
                "replaced by a fresh one",
                worker.process.pid,
                memory,
                worker.runs,
                memory_limit_mb,
            )
        worker.close()
        return False


def _overlaps_endings() -> bool:
    """Whether this process is the sweep's own, which waits for the runs' endings when the sweep ends (close)."""
    sweep = sweep_process()
    return sweep is not None and sweep.pid == os.getpid()


# The pool of this process: the jobs it runs share it.
POOL = WorkerPool()
