"""The private names of Hydra the runner uses, in one place; tests/test_compat.py fails, naming Hydra's version, when
one of them changes."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from hydra._internal.utils import get_args_parser  # Hydra's own command-line parser (hydra.main uses it)


def parse_command_line(arguments: Sequence[str]) -> argparse.Namespace | None:
    """`python -m runner <arguments>` as Hydra reads it (its options, and the overrides); None for a command line
    Hydra itself refuses with its usage line, or --version."""
    try:
        return get_args_parser().parse_args(list(arguments))
    except SystemExit:
        return None
