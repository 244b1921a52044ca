"""Pieces every command shares: option types, errors, JSON output, stop requests."""
from __future__ import annotations

import json
import tomllib
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from popplay.core.errors import UsageError


class BackendName(str, Enum):
    auto = "auto"
    numba = "numba"
    torch = "torch"


class DeviceName(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


BACKEND_HELP = ("numba (fused CPU loops) or torch (batched, CPU or CUDA); auto picks torch on a GPU or with "
                "--compile, numba otherwise.")
DEVICE_HELP = ("Where torch runs; auto picks cuda when a GPU is present for the populations, and the CPU for the "
               "deep agents (their networks are small: cuda only when asked for).")
OUT_HELP = "Run file to write (HDF5). Default: runs/<domain>-<timestamp>.h5."
JSON_HELP = ("Print one JSON object with the results on the last line of stdout (no live console; status lines "
             "still on stderr, --quiet silences them).")
TIME_BUDGET_HELP = "Learn for this many seconds of learning time instead of a fixed step budget."


RESUME_HELP = ("Continue this run file in place up to the new budget; every other setting comes "
               "from the file.")
CHECKPOINT_HELP = ("Write the complete state into the run file every N units of progress (agent-time "
                   "steps per trial, or episodes) or every 30s / 5m / 2h of wall time.")

# The options every `train` command shares, as reusable annotated types.
SeedOption = Annotated[int, typer.Option(help="Seed of every random stream.")]
BackendOption = Annotated[BackendName, typer.Option(help=BACKEND_HELP)]
DeviceOption = Annotated[DeviceName, typer.Option(help=DEVICE_HELP)]
QuietOption = Annotated[bool, typer.Option(
    "--quiet", help="No status or progress lines on stderr (errors and warnings still); without it they are "
                    "there with --json too (stdout carries only the results).")]
CompileOption = Annotated[Optional[bool], typer.Option(
    "--compile/--no-compile",
    help="Run the torch engine's steps through torch.compile (fullgraph; the first phase pays the "
         "compilation, seconds on a GPU, tens of seconds on a CPU). Default: on where the torch engine runs "
         "on CUDA, where it paid 1.1-19x; off on the CPU, where it did not (docs/performance.md). "
         "--no-compile for short GPU runs.", show_default=False)]
TimeBudgetOption = Annotated[Optional[float], typer.Option(help=TIME_BUDGET_HELP)]
OutOption = Annotated[Optional[Path], typer.Option(help=OUT_HELP, dir_okay=False)]
OverwriteOption = Annotated[bool, typer.Option(help="Replace --out if it exists.")]
JsonOption = Annotated[bool, typer.Option("--json", help=JSON_HELP)]
CheckpointOption = Annotated[Optional[str], typer.Option(help=CHECKPOINT_HELP)]
LogDirOption = Annotated[Optional[Path], typer.Option(
    help="Also write the curves as DIR/curves.csv and, with the tensorboard extra installed, TensorBoard "
         "event files (tensorboard --logdir DIR).", file_okay=False, metavar="DIR")]
ResumeOption = Annotated[Optional[Path], typer.Option(help=RESUME_HELP, dir_okay=False, metavar="RUN.h5")]
NprocOption = Annotated[int, typer.Option(
    min=1, help="Local processes (ranks) to shard the population over (loopback only); the number must divide "
                "the agents (bandit and cart-pole: the agents or the trials). Under torchrun the world size comes from "
                "torchrun instead.")]
DistTimeoutOption = Annotated[float, typer.Option(
    "--timeout", min=1.0, max=3600.0,
    help="Seconds a rank may go silent before the job stops (with several ranks).")]


# The options the deep `train` commands (dqn, reinforce, gorila, exarl) share.
ENV_HELP = "A gymnasium id (CartPole-v1, LunarLander-v3 with the box2d extra, popplay/CartPole-v1, ...)."
EVAL_HELP = "Greedy episodes played at the end for `quality` (0: skip)."
TIMEOUT_HELP = "Seconds any wait for another rank may take before the job ends with an error."
EnvOption = Annotated[str, typer.Option(help=ENV_HELP)]
GammaOption = Annotated[float, typer.Option(min=0.0, max=1.0, help="Discount γ.")]
EvalEpisodesOption = Annotated[int, typer.Option(min=0, help=EVAL_HELP)]
RankTimeoutOption = Annotated[float, typer.Option(help=TIMEOUT_HELP)]


def parse_hidden(hidden: str, example: str) -> tuple[int, ...]:
    """--hidden's comma-separated layer widths (``example`` shows the form in the error)."""
    try:
        return tuple(int(v) for v in hidden.split(","))
    except ValueError:
        raise UsageError(f"--hidden: expected comma-separated widths such as {example} (got {hidden!r})") from None


def given(ctx: typer.Context, name: str) -> bool:
    """Whether the user set option ``name`` (on the command line or in --config), as
    opposed to leaving its default."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT", "DEFAULT_MAP")


# \\[ : the help's markup would take "[bandit]" for a style and drop it
CONFIG_HELP = ("TOML file of options (agent-steps = 131072, differentiation = \"top2\", …): top-level keys apply to "
               "every train command that has them, a [DOMAIN] table (\\[bandit], \\[dqn], …) to that command, "
               "overriding them; options on the command line override both.")
CONFIG_LIMIT = 1 << 20  # bytes: an options file is a few lines


def load_config(ctx: typer.Context, param: Any, value: Optional[Path]) -> Optional[Path]:
    """Eager callback of ``--config``: the file's options become this command's defaults
    (click's default map), so anything given on the command line still wins.

    Top-level keys apply to every ``train`` command that has them; a ``[DOMAIN]`` table
    applies to that command and overrides them. A key that no ``train`` command knows,
    a table no command is named after, or a key of this command's table that it does not
    know, is an error naming it."""
    if value is None:
        return value

    domain = ctx.info_name or ""
    try:
        if Path(value).exists() and not Path(value).is_file():  # a FIFO or a device would block or never end
            raise UsageError(f"--config {value}: not a regular file")
        if Path(value).exists() and Path(value).stat().st_size > CONFIG_LIMIT:
            raise UsageError(f"--config {value}: larger than {CONFIG_LIMIT // 1024} KiB; not an options file")
        with open(value, "rb") as handle:
            data = tomllib.load(handle)
    except OSError as error:
        raise UsageError(f"--config {value}: {error.strerror or error}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError) as error:
        raise UsageError(f"--config {value}: not valid TOML ({' '.join(str(error).split())})") from None
    commands = _train_commands(ctx)
    top = {k: v for k, v in data.items() if not isinstance(v, dict)}
    for table in (k for k, v in data.items() if isinstance(v, dict)):
        if table not in commands:
            raise UsageError(f"--config {value}: [{table}] is not a train command ({', '.join(commands)})")
    names = {p.name: p for p in ctx.command.params if p.name not in ("config", "help")}
    known = ", ".join(sorted(n.replace("_", "-") for n in names if n != "json_output"))
    options: dict[str, Any] = {}
    for key, setting in top.items():
        name = _option_key(key)
        if name in names and not getattr(names[name], "hidden", False):  # a hidden option is only a hint
            options[name] = setting
        elif not any(name in _option_names(ctx, other) for other in commands if other != domain):
            raise UsageError(f"--config {value}: {key!r} is not an option of any train command "
                             f"(`popplay train {domain}` has {known})")
    for key, setting in (data.get(domain) or {}).items():
        name = _option_key(key)
        if name not in names or isinstance(setting, dict):
            raise UsageError(f"--config {value}: [{domain}] {key!r} is not an option of `popplay train {domain}` "
                             f"({known})")
        options[name] = setting
    for name, setting in list(options.items()):
        if getattr(names[name], "multiple", False):  # a repeatable option (--hp): one text or a list of them
            if isinstance(setting, str):
                options[name] = [setting]
                continue
            if isinstance(setting, list) and all(isinstance(v, str) for v in setting):
                continue
        if isinstance(setting, list) and setting and all(type(v) is int for v in setting):
            options[name] = setting = ",".join(str(v) for v in setting)  # widths: hidden = [64, 64]
        flag = getattr(names[name], "is_flag", False)
        if isinstance(setting, (list, dict)) or (isinstance(setting, bool) and not flag):
            raise UsageError(f"--config {value}: {name.replace('_', '-')} = {setting!r} is not a value it takes")
    options = {k: str(v) if isinstance(v, (int, float)) and k == "checkpoint_every" else v for k, v in options.items()}
    ctx.default_map = {**(ctx.default_map or {}), **options}
    return value


def _option_key(key: str) -> str:
    name = key.replace("-", "_").lstrip("_")
    return "json_output" if name == "json" else name


def _train_commands(ctx: typer.Context) -> list[str]:
    """The names of the ``train`` commands (the group this command belongs to)."""
    group = ctx.parent.command if ctx.parent is not None else None
    return list(group.list_commands(ctx.parent)) if group is not None and hasattr(group, "list_commands") else []


def _option_names(ctx: typer.Context, command: str) -> set[str]:
    """The parameter names of ``train COMMAND`` (building it if it is generated)."""
    group = ctx.parent.command if ctx.parent is not None else None
    found = group.get_command(ctx.parent, command) if group is not None else None
    return {p.name for p in found.params} if found is not None else set()


SeedsOption = Annotated[int, typer.Option(
    min=1, help="Train this many seeds (--seed, --seed + 1, …) one after another, a run file each (-seed<N> "
                "added to its name), and report every metric's mean and standard error over them.")]
ConfigOption = Annotated[Optional[Path], typer.Option(help=CONFIG_HELP, dir_okay=False, is_eager=True,
                                                       callback=load_config, metavar="FILE.toml")]


def default_out(domain: str) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    directory = Path("runs")
    directory.mkdir(exist_ok=True)
    path = directory / f"{domain}-{stamp}.h5"
    suffix = 1
    while path.exists():
        suffix += 1
        path = directory / f"{domain}-{stamp}-{suffix}.h5"
    return path


def print_json(payload: dict[str, Any]) -> None:
    print(json.dumps(payload, sort_keys=True, default=_jsonable))


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
