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


BACKEND_HELP = "numba (fused CPU loops) or torch (batched, CPU or CUDA); auto picks torch on a GPU, numba otherwise."
DEVICE_HELP = "Where torch runs; auto picks cuda when a GPU is present."
OUT_HELP = "Run file to write (HDF5). Default: runs/<domain>-<timestamp>.h5."
JSON_HELP = "Print one JSON object with the results on the last line of stdout (no live console)."
TIME_BUDGET_HELP = "Learn for this many seconds of learning time instead of a fixed step budget."


RESUME_HELP = ("Continue this run file in place up to the new budget; every other setting comes "
               "from the file.")
CHECKPOINT_HELP = ("Write the complete state into the run file every N units of progress (agent-time "
                   "steps per trial, or episodes) or every 30s / 5m / 2h of wall time.")

# The options every `train` command shares, as reusable annotated types.
SeedOption = Annotated[int, typer.Option(help="Seed of every random stream.")]
BackendOption = Annotated[BackendName, typer.Option(help=BACKEND_HELP)]
DeviceOption = Annotated[DeviceName, typer.Option(help=DEVICE_HELP)]
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


CONFIG_HELP = ("TOML file of options for this command (agent-steps = 131072, differentiation = \"top2\", …; at the "
               "top level or under a [bandit]/[cartpole]/[knights] table); options on the command line override it.")


def load_config(ctx: typer.Context, param: Any, value: Optional[Path]) -> Optional[Path]:
    """Eager callback of ``--config``: the file's options become this command's defaults
    (click's default map), so anything given on the command line still wins."""
    if value is None:
        return value

    domain = ctx.info_name or ""
    try:
        with open(value, "rb") as handle:
            data = tomllib.load(handle)
    except OSError as error:
        raise UsageError(f"--config {value}: {error.strerror or error}") from None
    except tomllib.TOMLDecodeError as error:
        raise UsageError(f"--config {value}: not valid TOML ({error})") from None
    table = data.get(domain) if isinstance(data.get(domain), dict) else {
        k: v for k, v in data.items() if not isinstance(v, dict)}
    names = {p.name: p for p in ctx.command.params if p.name not in ("config", "help")}
    options: dict[str, Any] = {}
    for key, setting in table.items():
        name = key.replace("-", "_").lstrip("_")
        name = "json_output" if name == "json" else name
        if name not in names:
            known = ", ".join(sorted(n.replace("_", "-") for n in names if n != "json_output"))
            raise UsageError(f"--config {value}: {key!r} is not an option of `popplay train {domain}` ({known})")
        options[name] = str(setting) if isinstance(setting, (int, float)) and name in ("checkpoint_every",) else setting
    ctx.default_map = {**(ctx.default_map or {}), **options}
    return value


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
