"""Values the runner puts on its own processes' command lines read back unchanged through Hydra's grammar."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from runner.overrides import quoted

NASTY = [
    "/runs/plain",
    "/runs/with space/and,comma",
    "/runs/key=value",
    "/runs/[bracketed]/{braced}",
    "/runs/it's",
    '/runs/"double"',
    "C:\\runs\\windows",
    "\\\\server\\share\\",
    "/runs/back\\'slash-quote",
    "/runs/$HOME and $(date)",
    "/runs/${not.an.interpolation}",
    "/runs/\\${escaped}",
    "'",
    "\\",
    "",
]


@pytest.mark.parametrize("value", NASTY)
def test_a_quoted_value_parses_back_to_itself(value):
    parsed = OverridesParser.create().parse_override(f"hydra.run.dir={quoted(value)}")
    assert parsed.key_or_group == "hydra.run.dir"
    assert not parsed.is_sweep_override()
    # The parsed value is what the config holds; OmegaConf then reads `${` as interpolation unless escaped.
    assert OmegaConf.create({"dir": parsed.value()}).dir == value
    if "${" not in value:
        assert parsed.value() == value


def test_shell_scripts_get_the_same_quoting():
    value = "/runs/it's a \\ test, $HOME"
    printed = subprocess.run(
        [sys.executable, "-m", "runner.overrides", value], capture_output=True, text=True, check=True
    ).stdout
    assert printed == quoted(value) + "\n"
