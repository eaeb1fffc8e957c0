"""Where the runner's start-up goes: each library's share of the time before the first training step.

The phases build on each other as in the runner: a bare interpreter, then importing TensorFlow, then
MLflow, then opening an existing sqlite tracking store, then composing the config with Hydra. Each is
a fresh interpreter running the code of the phases so far; a phase costs its wall time minus the one
before it, so libraries TensorFlow has already imported (NumPy, protobuf) are not counted twice.
Phases are interleaved over the repeats, and medians reported.

    python -m bench.startup --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONF = Path(__file__).resolve().parents[1] / "conf"

# (name, what it costs, the code it adds to the phases before it); in the code, {db} is an existing
# sqlite store and {conf} the runner's conf/.
PHASES = (
    ("interpreter", "a bare Python process", "pass"),
    (
        "tensorflow",
        "import TensorFlow and tf_keras (the reference pays this too)",
        "import os; os.environ['TF_USE_LEGACY_KERAS'] = '1'; import tensorflow, tf_keras",
    ),
    (
        "mlflow import",
        "import MlflowClient (MLflow's package imports pandas, its GenAI and gateway modules)",
        "from mlflow.tracking import MlflowClient",
    ),
    (
        "mlflow store",
        "open an existing sqlite store (SQLAlchemy, Alembic's schema check)",
        "MlflowClient('sqlite:///{db}').search_experiments()",
    ),
    (
        "hydra",
        "import Hydra and compose the runner's config (its schema registered first, as the command does)",
        "from runner.config.schema import register; register()\nfrom hydra import compose, initialize_config_dir\n"
        "with initialize_config_dir(config_dir='{conf}', version_base='1.3'): compose('config')",
    ),
)
DESCRIPTIONS = {name: what for name, what, _ in PHASES}


def programs() -> dict[str, str]:
    """Each phase's program: its own code after that of every phase before it."""
    lines, result = [], {}
    for name, _, code in PHASES:
        lines.append(code)
        result[name] = "\n".join(lines)
    return result


def wall_seconds(code: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    return time.perf_counter() - started


def measure(repeats: int) -> dict[str, float]:
    """Median seconds each phase adds to the one before it, over `repeats` interleaved rounds."""
    with tempfile.TemporaryDirectory() as scratch:
        db = f"{scratch}/mlflow.db"
        # Create the store first: users open an existing one.
        wall_seconds(f"from mlflow.tracking import MlflowClient; MlflowClient('sqlite:///{db}').search_experiments()")
        times: dict[str, list[float]] = {name: [] for name, _, _ in PHASES}
        for _ in range(repeats):
            for name, program in programs().items():
                times[name].append(wall_seconds(program.format(db=db, conf=CONF)))
    medians = [statistics.median(times[name]) for name, _, _ in PHASES]
    return {name: medians[i] - medians[i - 1] for i, (name, _, _) in enumerate(PHASES) if i > 0}


def markdown_table(costs: dict[str, float]) -> str:
    lines = ["| phase | seconds | what |", "| --- | ---: | --- |"]
    lines += [f"| {name} | {seconds:.2f} | {DESCRIPTIONS[name]} |" for name, seconds in costs.items()]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.startup", description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    print(markdown_table(measure(args.repeats)))


if __name__ == "__main__":
    main()
