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


def _compositions(monkeypatch, tmp_path, overrides: list[str]) -> tuple[int, list[str]]:
    """How many times Hydra composes the config to run `overrides` of a small app, and the modes its task saw."""
    from hydra._internal.hydra import Hydra
    from hydra.core.hydra_config import HydraConfig

    from runner.compat.hydra_internals import mode_from_command_line

    (tmp_path / "conf").mkdir(exist_ok=True)
    (tmp_path / "conf" / "app.yaml").write_text("answer: 42\n")
    composed, modes = [0], []
    compose = Hydra.compose_config

    def counted(self, *args, **kwargs):
        composed[0] += 1
        return compose(self, *args, **kwargs)

    monkeypatch.setattr(Hydra, "compose_config", counted)

    @hydra.main(version_base="1.3", config_path=str(tmp_path / "conf"), config_name="app")
    def app(config):
        modes.append(str(HydraConfig.get().mode))

    arguments = [f"hydra.run.dir={tmp_path}", "hydra.output_subdir=null", *overrides]
    monkeypatch.setattr("sys.argv", ["app", *arguments])
    with mode_from_command_line(arguments):
        app()
    return composed[0], modes


def test_a_command_line_that_names_its_mode_is_composed_once(monkeypatch, tmp_path):
    """Hydra's _run_hydra composes once for Hydra.get_mode, then again to run; hydra.mode=RUN on the command line
    spares the first (runner.__main__ runs a sweep job's run so), and any other command line is run as Hydra runs it."""
    assert _compositions(monkeypatch, tmp_path, ["hydra.mode=RUN"]) == (1, ["RunMode.RUN"]), WRITTEN_FOR
    assert _compositions(monkeypatch, tmp_path, []) == (2, ["RunMode.RUN"]), (
        f"Hydra no longer composes a command line twice (Hydra.get_mode): drop mode_from_command_line. {WRITTEN_FOR}"
    )
    from hydra._internal.hydra import Hydra

    assert Hydra.get_mode.__name__ == "get_mode", "mode_from_command_line left Hydra.get_mode replaced"
