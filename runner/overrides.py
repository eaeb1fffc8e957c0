"""A value on a command line the runner builds for its own processes (a sweep job's training, a cluster task, a
SLURM script), written in Hydra's override grammar so that the process reads back exactly that value."""

from __future__ import annotations

import re
import sys

# A run of backslashes that Hydra's quoted-string grammar would read as escapes: before a quote, or at the end
# (before the closing quote). Elsewhere a backslash is itself.
_ESCAPING_BACKSLASHES = re.compile(r"(\\+)(?='|$)")
# OmegaConf reads `${` as an interpolation even inside a quoted value; `\${` is a literal `${`, and the
# backslashes before an escaped `${` are escapes too.
_INTERPOLATION = re.compile(r"(\\*)\$\{")


def quoted(value: str) -> str:
    """`value` as one quoted override value: spaces, commas (which would make a sweep), `=`, brackets, quotes,
    backslashes and `${` stay part of it."""
    text = _INTERPOLATION.sub(lambda match: match.group(1) * 2 + "\\${", value)
    text = _ESCAPING_BACKSLASHES.sub(lambda match: match.group(1) * 2, text)
    return "'" + text.replace("'", "\\'") + "'"


if __name__ == "__main__":  # for shell scripts: "hydra.run.dir=$(python -m runner.overrides "$RUN_DIR")"
    print(quoted(sys.argv[1]))
