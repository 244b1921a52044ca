"""Commands whose results are pinned: the same command line must give the same run file
datasets and the same ``--json`` numbers, bit for bit, whatever the code's layout.

``python tests/pinned/commands.py --write`` records ``golden.json`` (run it only when a
change of results is intended, and say so in the commit); ``--write-machine`` adds the
records of this machine class for the commands whose bits depend on the CPU
(``BY_MACHINE``); ``tests/test_pinned.py`` checks every command against it. Timings,
paths and provenance are left out; what is left is everything the run computes.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "golden.json"

BANDIT = ["--arms", "10", "--agents", "8", "--trials", "16", "--agent-steps", "512", "--share-every", "16",
          "--seed", "3"]
CARTPOLE = ["--agents", "4", "--trials", "2", "--agent-steps", "256", "--share-every", "16", "--replicate-every", "2",
            "--mutate-q", "0.01", "--seed", "1"]
KNIGHTS = ["--agents", "6", "--games-per-agent", "4", "--episodes", "12", "--rows", "4", "--cols", "5",
           "--pieces", "3", "--hidden", "4", "--eval-every", "4", "--eval-games", "4", "--replicate-every", "4",
           "--replicate-fraction", "0.34", "--mutate-weights", "0.01", "--seed", "2"]
DQN = ["--env-steps", "600", "--learning-starts", "100", "--hidden", "16,16", "--batch-size", "16",
       "--eval-episodes", "3", "--seed", "4"]
REINFORCE = ["--workers", "2", "--episodes", "5", "--hidden", "8", "--eval-episodes", "3", "--seed", "5"]
A2C = ["--episodes", "12", "--copies", "2", "--n-steps", "8", "--hidden", "8,8", "--eval-episodes", "2", "--seed", "6"]
CONTINUOUS = ["--env-steps", "300", "--learning-starts", "100", "--batch-size", "16", "--hidden", "16,16",
              "--eval-episodes", "1", "--seed", "7"]

#: (name, argv after `popplay`, run file it writes or None, whether it starts several processes)
COMMANDS: list[tuple[str, list[str], str | None, bool]] = [
    ("bandit", ["train", "bandit", *BANDIT, "--out", "bandit.h5"], "bandit.h5", False),
    ("bandit-torch-top2", ["train", "bandit", *BANDIT, "--differentiation", "top2", "--backend", "torch",
                           "--out", "bandit-torch.h5"], "bandit-torch.h5", False),
    ("bandit-nproc2", ["train", "bandit", *BANDIT, "--nproc", "2", "--out", "bandit-np2.h5"], "bandit-np2.h5", True),
    ("cartpole", ["train", "cartpole", *CARTPOLE, "--out", "cartpole.h5"], "cartpole.h5", False),
    ("cartpole-nproc2", ["train", "cartpole", *CARTPOLE, "--nproc", "2", "--out", "cartpole-np2.h5"],
     "cartpole-np2.h5", True),
    ("knights", ["train", "knights", *KNIGHTS, "--out", "knights.h5"], "knights.h5", False),
    ("tournament", ["tournament", "knights.h5", "--games", "2", "--anchor", "greedy"], None, False),
    ("evaluate-knights", ["evaluate", "knights.h5", "--opponent", "greedy", "--games", "4"], None, False),
    ("evaluate-bandit", ["evaluate", "bandit.h5"], None, False),
    ("dqn", ["train", "dqn", *DQN, "--out", "dqn.h5"], "dqn.h5", False),
    ("dqn-train-every", ["train", "dqn", *DQN, "--train-every", "50", "--out", "dqn-k.h5"], "dqn-k.h5", False),
    ("dqn-collective", ["train", "dqn", *DQN, "--topology", "collective", "--simulators", "2",
                        "--out", "dqn-coll.h5"], "dqn-coll.h5", True),
    ("evaluate-dqn", ["evaluate", "dqn.h5", "--episodes", "3"], None, False),
    ("reinforce-local", ["train", "reinforce", *REINFORCE, "--topology", "local", "--out", "rf-local.h5"],
     "rf-local.h5", False),
    ("reinforce-server", ["train", "reinforce", *REINFORCE, "--out", "rf-server.h5"], "rf-server.h5", True),
    ("a2c", ["train", "a2c", *A2C, "--out", "a2c.h5"], "a2c.h5", False),
    ("td3", ["train", "td3", *CONTINUOUS, "--out", "td3.h5"], "td3.h5", False),
    ("ddpg-per", ["train", "ddpg", *CONTINUOUS, "--per", "--out", "ddpg.h5"], "ddpg.h5", False),
]

#: Commands whose results are what MKL's matrix products computed. MKL's strict mode
#: (MKL_CBWR=AUTO,STRICT, which popplay sets) gives the same bits on every Intel CPU with
#: AVX2 or more, but AMD's CPUs take other kernels: the weights differ in their last bits
#: (TD3 and DDPG+PER, whose prioritised replay feeds rounding back into what they sample,
#: by more), and so do the numbers they print. Their results are pinned per machine class
#: (``machine()``); the other commands' are the same on every machine.
BY_MACHINE = {"dqn", "dqn-train-every", "dqn-collective", "reinforce-local", "reinforce-server", "a2c", "td3",
              "ddpg-per"}


def machine() -> str:
    """The class of CPU whose matrix products a run file records: its vendor and the
    vector instructions torch dispatches to, e.g. ``GenuineIntel AVX512``."""
    import platform

    import torch

    vendor = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            vendor = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("vendor_id")), vendor)
    except OSError:
        pass
    return f"{vendor} {torch.backends.cpu.get_cpu_capability()}"


#: JSON keys that measure time or name paths: not results.
def _volatile(key: str) -> bool:
    return key in ("out", "latest", "created") or "second" in key or "_per_" in key or key.endswith("_rate")


def _clean(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in sorted(value.items()) if not _volatile(k)}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    if isinstance(value, float):
        return repr(value)  # exact
    return value


def _attr(value: Any) -> Any:
    import numpy as np

    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.ndarray):
        return [_attr(v) for v in value.tolist()]
    if isinstance(value, (np.floating, float)):
        return repr(float(value))
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.bool_,)):
        return bool(value)
    return value


def digest(path: Path) -> dict[str, Any]:
    """Every dataset (dtype, shape, SHA-256 of its bytes) and every attribute of a run
    file, except timings and provenance."""
    import h5py

    out: dict[str, Any] = {}
    with h5py.File(path, "r") as f:
        def visit(name: str, obj: Any) -> None:
            if _volatile(name.rsplit("/", 1)[-1]):
                return
            if isinstance(obj, h5py.Dataset):
                data = obj[()]
                import numpy as np

                data = np.ascontiguousarray(data)
                out[name] = [str(data.dtype), list(data.shape), hashlib.sha256(data.tobytes()).hexdigest()[:16]]
            attrs = {k: _attr(v) for k, v in sorted(obj.attrs.items()) if not _volatile(k)}
            if attrs:
                out[name + "@"] = attrs
        f.visititems(visit)
        out["/@domain"] = _attr(f.attrs["domain"])
        out["/@complete"] = _attr(f.attrs["complete"])
        out["/@phases"] = _attr(f.attrs["phases"])
    return out


def run_all(workdir: Path, *, names: set[str] | None = None, timeout: float = 600,
            in_process: Any = None) -> dict[str, Any]:
    """Run the commands (in order, in ``workdir``) through ``python -m popplay``; return
    each one's cleaned ``--json`` output and run-file digest. ``in_process(argv) ->
    (exit code, stdout)`` runs the one-process commands without starting Python again."""
    results: dict[str, Any] = {}
    env = {**os.environ, "NUMBA_NUM_THREADS": "2", "COLUMNS": "200"}
    for name, argv, out, procs in COMMANDS:
        if names is not None and name not in names:
            continue
        if in_process is not None and not procs:
            code, stdout = in_process([*argv, "--json"])
            if code != 0:
                raise RuntimeError(f"{name}: exit {code}")
        else:
            done = subprocess.run([sys.executable, "-m", "popplay", *argv, "--json"], cwd=workdir, env=env,
                                  capture_output=True, text=True, timeout=timeout)
            if done.returncode != 0:
                raise RuntimeError(f"{name}: exit {done.returncode}: {done.stderr.strip()[-2000:]}")
            code, stdout = done.returncode, done.stdout
        entry: dict[str, Any] = {"json": _clean(json.loads(stdout.strip().splitlines()[-1]))}
        if out is not None:
            entry["file"] = digest(workdir / out)
        results[name] = entry
    return results


#: Every command whose options are pinned (names only: every option a user had still works).
HELP_COMMANDS = [["train", d] for d in ("bandit", "cartpole", "knights", "dqn", "reinforce", "a2c", "td3", "ddpg",
                                        "gorila")] + [[c] for c in ("evaluate", "tournament", "play", "inspect",
                                                                    "lineage", "export", "plot", "reproduce")]


def options_of(argv: list[str], help_text: Any = None) -> list[str]:
    """The option names ``popplay ARGV --help`` lists; ``help_text(argv) -> str`` gets the
    help without starting Python again."""
    import re

    if help_text is not None:
        text = help_text(argv)
    else:
        env = {**os.environ, "COLUMNS": "400", "TERMINAL_WIDTH": "400"}
        done = subprocess.run([sys.executable, "-m", "popplay", *argv, "--help"], env=env, capture_output=True,
                              text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{argv}: exit {done.returncode}: {done.stderr.strip()}")
        text = done.stdout
    return sorted(set(re.findall(r"(?<![\w-])--[a-z0-9][a-z0-9-]*", text)))


def main() -> None:
    """``--write``: record every command's results (an intended change of results: the
    records of other machine classes are dropped, as they no longer hold);
    ``--write-machine``: add this machine class's records of the BY_MACHINE commands,
    leaving everything else as it is; neither: say which commands differ."""
    import tempfile

    golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    here = machine()
    only_machine = "--write-machine" in sys.argv
    with tempfile.TemporaryDirectory() as tmp:
        results = run_all(Path(tmp), names=BY_MACHINE if only_machine else None)
    for name in BY_MACHINE & set(results):
        kept = golden.get(name, {}).get("by_machine", {}) if only_machine else {}
        results[name] = {"by_machine": {**kept, here: results[name]}}
        if not only_machine and "--write" not in sys.argv:  # compare with this machine's record only
            golden[name] = {"by_machine": {here: golden.get(name, {}).get("by_machine", {}).get(here)}}
    if only_machine:
        golden.update({name: results[name] for name in BY_MACHINE})
        GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
        print(f"wrote {here}'s records of {len(BY_MACHINE)} commands to {GOLDEN}")
        return
    results["options"] = {" ".join(argv): options_of(argv) for argv in HELP_COMMANDS}
    if "--write" in sys.argv:
        GOLDEN.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
        print(f"wrote {GOLDEN} (machine-dependent records for {here} only)")
    else:
        bad = [name for name in results if results[name] != golden.get(name)]
        print("differ:", bad or "none")


if __name__ == "__main__":
    main()
