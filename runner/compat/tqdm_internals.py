"""tqdm's set of the bars still drawn (`tqdm._instances`, not a documented API); tests/test_compat.py fails, naming
tqdm's version, when it changes."""

from __future__ import annotations

from tqdm import tqdm


def close_open_bars() -> None:
    """Close every progress bar still drawn, so that what is printed next starts a line of its own."""
    for bar in list(getattr(tqdm, "_instances", ())):
        bar.close()
