"""`python -m runner [overrides]`: compose the config with Hydra, validate it, train."""

import logging
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

import runner  # noqa: F401  (selects tf_keras before TensorFlow is imported)
from runner.errors import RunnerError
from runner.settings import from_config

log = logging.getLogger("runner")


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float:
    try:
        config = OmegaConf.to_container(cfg, resolve=True)
        settings = from_config(config)
        # Imported after validation: a mistyped override fails before TensorFlow loads.
        from runner.train import run

        hydra_config = HydraConfig.get()
        result = run(settings, config, hydra_config.runtime.output_dir, list(hydra_config.overrides.task))
    except RunnerError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    final = result.final
    log.info("done: test_accuracy %.4f, eval_accuracy %.4f, MLflow run %s",
             final.test_accuracy, result.eval_accuracy, result.run_id)
    return final.test_accuracy


if __name__ == "__main__":
    main()
