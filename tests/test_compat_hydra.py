"""The Hydra internals runner/compat/hydra_internals.py relies on still behave as written for Hydra 1.3: when an
upgrade changes one, this fails naming Hydra's version and the internal."""

from __future__ import annotations

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from runner.compat.hydra_internals import parse_command_line, rename_stored_config

WRITTEN_FOR = f"runner/compat/hydra_internals.py was written for Hydra 1.3; this is Hydra {hydra.__version__}"


def test_hydras_command_line_parser_reads_options_and_overrides():
    options = parse_command_line(["-m", "batch=32,64", "--cfg", "job", "--config-name", "other"])
    assert options is not None, f"hydra._internal.utils.get_args_parser refused a valid command line. {WRITTEN_FOR}"
    assert (options.multirun, options.cfg, options.config_name) == (True, "job", "other"), WRITTEN_FOR
    assert options.overrides == ["batch=32,64"], WRITTEN_FOR
    assert parse_command_line(["--no-such-option"]) is None, WRITTEN_FOR


def test_a_stored_config_moves_to_another_name_in_the_config_store():
    store = ConfigStore.instance()
    store.store(group="runner_compat_test/launcher", name="plain", node=OmegaConf.create({"answer": 42}))
    rename_stored_config(store, "runner_compat_test/launcher", "plain", "plain_schema")
    group = store.repo.get("runner_compat_test", {}).get("launcher", {})
    assert "plain.yaml" not in group, f"ConfigStore.repo's layout changed. {WRITTEN_FOR}"
    assert group["plain_schema.yaml"].node.answer == 42, f"ConfigStore.repo's layout changed. {WRITTEN_FOR}"
    store.repo.pop("runner_compat_test")
