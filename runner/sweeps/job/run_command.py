"""How a sweep's run is trained again: its `python -m runner` arguments, working directory and environment, written
in its run directory when its job starts it (RUN_COMMAND_FILE), so that the sweep can continue that run at its end
(runner.sweeps.job.champion) with exactly the config it trained with."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

from runner.errors import RunnerError

RUN_COMMAND_FILE = "run_command.json"


@dataclass(frozen=True)
class RunCommand:
    """`python -m runner <arguments>` in `cwd`, with `environ` added to the sweep's environment."""

    arguments: list[str]
    cwd: str
    environ: dict[str, str]

    def write(self, run_dir: str) -> None:
        with open(os.path.join(run_dir, RUN_COMMAND_FILE), "w") as handle:
            json.dump(asdict(self), handle, indent=1)

    @classmethod
    def read(cls, run_dir: str) -> RunCommand:
        path = os.path.join(run_dir, RUN_COMMAND_FILE)
        try:
            with open(path) as handle:
                return cls(**json.load(handle))
        except (OSError, ValueError, TypeError) as error:
            raise RunnerError(
                f"{path} cannot be read ({type(error).__name__}: {error}): the sweep writes it when it starts the "
                "run, to continue that run at its end. Fix: continue the run yourself: python -m runner with the "
                f"run's overrides (its MLflow tag `overrides`) and hydra.run.dir={run_dir} logs its model, since it "
                "has trained every epoch."
            ) from None
