"""Every `python -m runner` command line the documentation shows still composes: each one, taken from the shell
code blocks of README.md and docs/*.md, runs with `--cfg job` added (the config is composed and printed, nothing
trains), so a renamed key, group option, `_target_` argument or launcher fails here, naming the page and line of
the command that went stale. README's commands run in new processes, as a user runs them; the pages' many
commands in processes forked from one that imported the runner once (the same `python -m runner`, without a
second of start-up each).

How a command is checked, by two invocations:
- `python -m runner <its arguments> --cfg job` must exit 0 (for a sweep: its first job, each swept override at
  its first value). Before Hydra prints the config, the runner composes the command line itself
  (runner.config.check) and refuses unknown keys, options and values of the wrong type.
- `python -m runner -m <its arguments> --cfg job`: Hydra 1.3 refuses `--cfg` together with `-m` ("Only one of
  --run, --multirun, --cfg, --info and --shell_completion can be specified", a traceback, exit 1), but only
  after the runner's own checks of a sweep, which go further: every value of every swept override composed,
  each composition's `_target_` callables imported and their arguments checked against their signatures, the
  launcher's extra installed. Any of them refusing ends in exit 2 with an `error:` paragraph. So this must
  reach Hydra's refusal and print no `error:`. (A single run checks its `_target_`s only when it trains.)
- `sbatch [options] slurm/<script> <overrides>`: the script's arguments are overrides of the runner command the
  script runs; that command, with the script's own strategy and cluster, is checked as above.

What `--cfg job` cannot see is not checked: files and directories (`dataset.path`, `init.from`), devices, a
tracking server, and the settings' cross-field rules, which apply when a run starts. The documented commands
that are meant to fail (a page showing what a mistake prints) are listed in DOCUMENTED_ERRORS and must fail with
exit 2 and the error line the page shows.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers.cli import cli_env
from helpers.config import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# Code blocks with these info strings are shell (```` ``` ```` alone, too); ```python, ```yaml, ```json and
# ```mermaid blocks hold no command lines.
SHELL_BLOCKS = ("", "bash", "sh", "shell", "console")
FENCE = re.compile(r"^\s*```(\S*)\s*$")
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")

# Placeholders the pages write where a reader puts their own value; each becomes a real-looking one.
PLACEHOLDERS = {
    "<run id>": "0123456789abcdef0123456789abcdef",  # init.from=runs:/<run id>/model: an MLflow run id
    "<model id>": "m-0123456789abcdef0123456789abcdef",  # init.from=<model id>: an MLflow 3 LoggedModel's id
    "<head>": "127.0.0.1",  # hydra.launcher.ray.init.address=<head>:6379: the Ray head's host
    "<server>": "mlflow.example.internal",  # mlflow.tracking_uri=http://<server>:5000: the team's tracking server
}
# Commands that need a working directory other than the repository's root, by a part of the command line.
WORKING_DIRECTORIES = {
    # The example project (docs/your-own-experiment.md): its commands run from a copy of examples/mylab, where
    # Hydra's search path `file://conf_mylab` is relative to and `python -m` puts the package `mylab` on sys.path.
    "mylab": REPO / "examples" / "mylab",
}
# Commands a page shows failing on purpose, by their command line: the exit status and the start of the
# error line the page prints after them (which must also be what the command prints).
DOCUMENTED_ERRORS = {
    "python -m runner epoch=1": 2,  # configuration.md, "The config schema": an unknown key
    "python -m runner -m lr_scaling=none,lineer": 2,  # the same page: an unknown option in a sweep
}
# The SLURM scripts: the strategy and cluster each passes before the submitter's overrides (checked against
# the script's own text below, so that this table cannot go stale either).
SBATCH_SCRIPTS = {
    "slurm/train_multi_worker.sbatch": ["strategy=multi_worker_mirrored", "cluster=slurm"],
    "slurm/train_parameter_server.sbatch": ["strategy=parameter_server", "cluster=slurm"],
}
# What Hydra says when `--cfg` comes with `-m`: reached only once the runner's checks of the sweep passed.
HYDRA_REFUSES_CFG_WITH_MULTIRUN = "Only one of --run, --multirun, --cfg, --info and --shell_completion"


@dataclass(frozen=True)
class Command:
    page: str  # README.md, docs/sweeps.md, ...
    line: int  # of the command's first line on the page
    text: str  # as written, continuation lines joined
    arguments: tuple[str, ...]  # what follows `python -m runner`
    after: str = ""  # the line the page shows after it (a documented error)

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.text}"


def _code_blocks(text: str):
    """(first line number, lines) of each shell code block of a Markdown page."""
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        fence = FENCE.match(lines[index])
        if not fence:
            index += 1
            continue
        end = index + 1
        while end < len(lines) and not FENCE.match(lines[end]):
            end += 1
        if fence.group(1) in SHELL_BLOCKS:
            yield index + 2, lines[index + 1 : end]
        index = end + 1


def _joined(block: list[str], first: int):
    """(line number, logical line, the next line) with backslash continuations joined."""
    index = 0
    while index < len(block):
        number, line = first + index, block[index].strip()
        while line.endswith("\\") and index + 1 < len(block):
            index += 1
            line = line[:-1].rstrip() + " " + block[index].strip()
        index += 1
        yield number, line, block[index].strip() if index < len(block) else ""


def _runner_arguments(line: str) -> list[str] | None:
    """The arguments of `python -m runner ...` (or `.venv/bin/python -m runner`, `python3 -m runner`, the `runner`
    script, or `sbatch slurm/<script> ...`) in one shell line, after a `$ ` prompt, env-var prefixes and earlier
    `&&` commands; None when the line runs no runner."""
    for placeholder, value in PLACEHOLDERS.items():
        line = line.replace(placeholder, value)
    line = line.removeprefix("$ ")
    try:
        words = shlex.split(line, comments=True)
    except ValueError:  # not a shell line (an unbalanced quote in shown output)
        return None
    segments: list[list[str]] = [[]]
    for word in words:
        if word in ("&&", ";", "||", "|"):
            segments.append([])
        else:
            segments[-1].append(word)
    for segment in segments:
        while segment and ENV_ASSIGNMENT.match(segment[0]):  # TF_CONFIG='...' python -m runner ...
            segment = segment[1:]
        if not segment:
            continue
        program, rest = segment[0], segment[1:]
        if re.fullmatch(r"(\S*/)?python3?", program) and rest[:2] == ["-m", "runner"]:
            return rest[2:]
        if program == "runner":
            return rest
        if program == "sbatch":
            scripts = [index for index, word in enumerate(rest) if word in SBATCH_SCRIPTS]
            if scripts:
                return [*SBATCH_SCRIPTS[rest[scripts[0]]], *rest[scripts[0] + 1 :]]
    return None


def documented_commands() -> list[Command]:
    commands = []
    for page in PAGES:
        name = page.relative_to(REPO).as_posix()
        for first, block in _code_blocks(page.read_text()):
            for number, line, after in _joined(block, first):
                arguments = _runner_arguments(line)
                if arguments is not None:
                    commands.append(Command(name, number, line.removeprefix("$ "), tuple(arguments), after))
    return commands


def _is_sweep(arguments) -> bool:
    return "-m" in arguments or "--multirun" in arguments


def _first_job(arguments) -> list[str]:
    """A sweep's arguments as its first job gets them: no -m, each swept override at its first value, and
    Hydra's other options (`--cfg job`) kept."""
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser

    options = get_args_parser().parse_args(list(arguments))
    first = []
    for override in OverridesParser.create().parse_overrides(options.overrides):
        if override.is_discrete_sweep():
            first.append(f"{override.get_key_element()}={next(iter(override.sweep_string_iterator()))}")
        else:
            first.append(override.input_line)
    return [*first, *(["--cfg", options.cfg] if options.cfg else [])]


@pytest.fixture(scope="module")
def environment(tmp_path_factory) -> dict[str, str]:
    """The commands' environment: HOME in a temp directory (nothing lands in the user's), no MLflow variables of
    the developer's, and a stub `sbatch` on the PATH: a submitit_slurm sweep's check wants SLURM's sbatch to be
    there, and under --cfg job nothing is ever submitted (the stub fails if it runs)."""
    home = tmp_path_factory.mktemp("home")
    tools = tmp_path_factory.mktemp("bin")
    stub = tools / "sbatch"
    stub.write_text("#!/bin/sh\necho 'sbatch: a documented command was submitted under --cfg job' >&2\nexit 1\n")
    stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    env = cli_env({"HOME": str(home), "PATH": f"{tools}{os.pathsep}{os.environ.get('PATH', '')}"})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


@dataclass(frozen=True)
class Outcome:
    returncode: int
    stdout: str
    stderr: str


def _run(arguments, cwd: Path, env: dict[str, str]) -> Outcome:
    """`python -m runner <arguments>` in a new process, as a user runs it."""
    done = subprocess.run(
        [sys.executable, "-m", "runner", *arguments], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    return Outcome(done.returncode, done.stdout, done.stderr)


# Many commands at about a second of start-up each would make this test minutes long on a loaded 2-core machine:
# the pages' commands run in processes forked from one that imported the runner once. Each child runs the
# runner's `__main__` as `python -m runner` does (runpy, sys.argv, the exit status of its SystemExit or 1 with
# the traceback for an exception), with its own working directory, stdout and stderr.
_FORKING_RUNNER = r"""
import json, os, runpy, sys, tempfile, traceback
import hydra._internal.utils, numpy, runner.__main__, runner.config.components  # imported once, before the forks
from hydra.core.plugins import Plugins
Plugins.instance()  # Hydra's import of every module under hydra_plugins/, once
del sys.modules["runner.__main__"]  # runpy runs it anew as __main__, as `python -m runner` does

def child(cwd, arguments, out, err):
    os.chdir(cwd)
    os.dup2(out.fileno(), 1)
    os.dup2(err.fileno(), 2)
    sys.argv = ["runner", *arguments]
    code = 0
    try:
        runpy.run_module("runner", run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if not isinstance(stop.code, (int, type(None))):
            print(stop.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

jobs, results, running = json.load(sys.stdin), {}, {}
pending = list(enumerate(jobs))
while pending or running:
    while pending and len(running) < int(os.environ.get("DOCS_CHECK_PARALLEL", "3")):
        index, (cwd, arguments) = pending.pop(0)
        out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        pid = os.fork()
        if pid == 0:
            child(cwd, arguments, out, err)
        running[pid] = (index, out, err)
    pid, status = os.wait()
    index, out, err = running.pop(pid)
    out.seek(0)
    err.seek(0)
    results[index] = [os.waitstatus_to_exitcode(status), out.read().decode()[-3000:], err.read().decode()[-3000:]]
json.dump([results[index] for index in range(len(jobs))], sys.stdout)
"""


def _run_many(jobs: list[tuple[Path, list[str]]], env: dict[str, str]) -> list[Outcome]:
    """`python -m runner <arguments>` in `cwd` for each (cwd, arguments), in forks of one process."""
    done = subprocess.run(
        [sys.executable, "-c", _FORKING_RUNNER],
        input=json.dumps([[str(cwd), list(arguments)] for cwd, arguments in jobs]),
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [Outcome(*result) for result in json.loads(done.stdout)]


def _working_directory(command: Command) -> Path:
    return next((path for part, path in WORKING_DIRECTORIES.items() if part in command.text), REPO)


def plan(command: Command) -> list[list[str]]:
    """The runner invocations that check `command`: the sweep form (with -m) and the single run (a sweep's first
    job); only the command itself for a documented error."""
    arguments = [*command.arguments, *([] if "--cfg" in command.arguments else ["--cfg", "job"])]
    if _documented_error(command) is not None:
        return [arguments]
    sweep = arguments if _is_sweep(arguments) else ["-m", *arguments]
    return [sweep, _first_job(sweep)]


def _documented_error(command: Command) -> int | None:
    return DOCUMENTED_ERRORS.get(command.text.split("  #")[0].strip())


def judge(command: Command, invocations: list[list[str]], outcomes: list[Outcome]) -> str | None:
    """None if the documented command still composes (or fails as its page says), else why not."""
    expected = _documented_error(command)
    if expected is not None:
        [done] = outcomes
        shown = command.after.split("(...)")[0].split("...")[0].strip()
        if done.returncode != expected or not shown.startswith("error:") or shown not in done.stderr:
            return f"exit {done.returncode}, expected {expected} and {shown!r}:\n{done.stderr[-2000:]}"
        return None
    if len(outcomes) == 2:  # the runner's checks of the command as a sweep, then Hydra's refusal
        sweep = outcomes[0]
        if HYDRA_REFUSES_CFG_WITH_MULTIRUN not in sweep.stderr or "error:" in sweep.stderr:
            return f"the sweep's checks did not pass (exit {sweep.returncode}):\n{sweep.stderr[-2000:]}"
    done = outcomes[-1]
    if done.returncode != 0:
        return f"{' '.join(invocations[-1])}: exit {done.returncode}:\n{done.stderr[-2000:]}"
    return None


def check(commands: list[Command], env: dict[str, str], forked: bool) -> list[str | None]:
    """judge() for each command: each invocation in a new process, or (forked) in forks of one."""
    jobs = [(_working_directory(command), arguments) for command in commands for arguments in plan(command)]
    if forked:
        outcomes = _run_many(jobs, env)
    else:
        with ThreadPoolExecutor(max_workers=3) as pool:
            outcomes = list(pool.map(lambda job: _run(job[1], job[0], env), jobs))
    problems, at = [], 0
    for command in commands:
        invocations = plan(command)
        problems.append(judge(command, invocations, outcomes[at : at + len(invocations)]))
        at += len(invocations)
    return problems


def test_the_pages_show_the_commands_people_run():
    """The extraction finds what the pages hold, so the test below cannot pass by finding nothing."""
    commands = documented_commands()
    pages = {command.page for command in commands}
    assert {"README.md", "docs/configuration.md", "docs/sweeps.md", "docs/clusters.md"} <= pages, pages
    assert len(commands) >= 40, [str(command) for command in commands]
    texts = [command.text for command in commands]
    # README's set-up line (after `&&`), a TF_CONFIG prefix, an sbatch line and a sweep are among them.
    assert any(text.startswith("python3 -m venv .venv") for text in texts)
    assert any(text.startswith("TF_CONFIG=") for text in texts)
    assert any("sbatch" in text and "slurm/train_parameter_server.sbatch" in text for text in texts)
    assert any(_is_sweep(command.arguments) for command in commands)
    for text in DOCUMENTED_ERRORS:  # each documented mistake is still on its page
        assert text in texts, text


def test_the_sbatch_scripts_pass_the_strategy_and_cluster_this_test_assumes():
    for script, overrides in SBATCH_SCRIPTS.items():
        text = (REPO / script).read_text()
        assert "-m runner" in text and all(override in text for override in overrides), script


def _report(commands: list[Command], problems: list[str | None]) -> str:
    return "stale documented commands:\n" + "\n".join(
        f"{command}\n  {problem}" for command, problem in zip(commands, problems, strict=True) if problem
    )


@pytest.mark.slow  # a Python process per documented command
def test_every_runner_command_of_the_readme_composes_with_cfg_job(environment):
    """README's commands, each in a new `python -m runner ... --cfg job` process exactly as a user runs it."""
    commands = [command for command in documented_commands() if command.page == "README.md"]
    before = set(os.listdir(REPO))
    problems = check(commands, environment, forked=False)
    assert not any(problems), _report(commands, problems)
    assert set(os.listdir(REPO)) == before  # --cfg job wrote nothing (no outputs/, no mlflow.db)


@pytest.mark.slow  # a Python process per documented command
def test_every_runner_command_of_the_docs_composes_with_cfg_job(environment):
    """docs/*.md's commands, each run as `python -m runner ... --cfg job` in a fork of one process."""
    commands = [command for command in documented_commands() if command.page != "README.md"]
    before = set(os.listdir(REPO))
    problems = check(commands, environment, forked=True)
    assert not any(problems), _report(commands, problems)
    assert set(os.listdir(REPO)) == before


@pytest.mark.slow  # a Python process per documented command
@pytest.mark.parametrize("forked", [False, True], ids=["process", "forked"])
def test_a_stale_option_in_a_documented_line_fails_the_check(environment, forked):
    """The check means something, in new processes and in forks alike: copies of README's single run and
    sweep with an option that does not exist (`strategy=mirrord`), a later sweep value misspelt, a key misspelt
    (`sweep.seed`) or an argument the model does not take (`model.hiden`) are each reported, while the lines as
    documented pass."""
    commands = documented_commands()
    single = next(c for c in commands if c.page == "README.md" and "strategy=mirrored" in c.arguments)
    sweep = next(c for c in commands if c.page == "README.md" and _is_sweep(c.arguments))

    def stale(command: Command, old: str, new: str) -> Command:
        assert old in command.text
        text = command.text.replace(old, new, 1)
        return Command(command.page, command.line, text, tuple(_runner_arguments(text)))

    cases = [
        (single, None),
        (sweep, None),
        (stale(single, "strategy=mirrored", "strategy=mirrord"), "strategy=mirrord is not valid"),
        # Only a later value of the sweep is wrong: the runner's check of the whole sweep must catch it.
        (stale(sweep, "lr_scaling=none,linear", "lr_scaling=none,lineer"), "lr_scaling=lineer is not valid"),
        (stale(sweep, "sweep.seeds=3", "sweep.seed=3"), "sweep.seed=3 is not valid"),
        # An argument the model's callable does not take: found by the sweep form's check of the `_target_`s.
        (stale(single, "batch=128", "batch=128 model.hiden=32"), "takes no argument 'hiden'"),
    ]
    problems = check([command for command, _ in cases], environment, forked=forked)
    for (command, expected), problem in zip(cases, problems, strict=True):
        if expected is None:
            assert problem is None, f"{command}: {problem}"
        else:
            assert problem and expected in problem, f"{command}: {problem}"
