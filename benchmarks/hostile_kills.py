"""Hostile campaign, part two: ``kill -9`` of a training run at a random moment, then resume.

    python benchmarks/hostile_kills.py [--kills 3] [--seed 0] [--timeout 120] [--workdir DIR] [--json OUT]

For every job below (each domain; ``--nproc 2`` and Gorila through their launchers), ``--kills``
times: start the run in its own session, wait a random 0.3-4 s after its run file first
appears (or, one time in seven, 0-1.5 s after the start, which may be before any
checkpoint), SIGKILL the process the user started (the launcher, for multi-process
jobs: its ranks must follow it), then check:

- no process of the killed job is left after 5 s (ranks die with their parent);
- no temporary file is left beside the run file once a resume has run;
- the run file, if any, resumes: ``train --resume`` with the same total budget exits 0 within
  ``--timeout`` and writes a file marked complete.

Each kill is classed RESUMED (resumed and completed), ENDED_FIRST (the run had ended
before the kill came: not counted as a kill), NO_FILE (killed before the first
checkpoint: nothing to resume, which the resume must say in one line), LEFTOVER (processes
outlived the kill), INTERNAL (a traceback or "internal error" anywhere), FAILED (another
non-zero exit of the resume) or HANG (no end within ``--timeout``). The exit code is 1 when
any kill is classed LEFTOVER, INTERNAL, FAILED or HANG.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: (name, the run's command after ``popplay`` without its budget, the budget): runs of a few
#: seconds, so that a kill lands inside them; the resume is given the same total budget.
JOBS = [
    ("bandit", ["train", "bandit", "--agents", "64", "--trials", "64", "--checkpoint-every", "8"],
     ["--agent-steps", "4000000"]),
    ("cartpole", ["train", "cartpole", "--agents", "16", "--trials", "16", "--checkpoint-every", "4"],
     ["--agent-steps", "400000"]),
    ("knights", ["train", "knights", "--agents", "16", "--games-per-agent", "8", "--checkpoint-every", "5"],
     ["--episodes", "400"]),
    ("dqn", ["train", "dqn", "--checkpoint-every", "10", "--eval-episodes", "2"], ["--episodes", "600"]),
    ("ppo", ["train", "ppo", "--checkpoint-every", "2", "--eval-episodes", "2"], ["--env-steps", "20000"]),
    ("bandit --nproc 2", ["train", "bandit", "--agents", "64", "--trials", "64", "--checkpoint-every", "8",
                          "--nproc", "2"], ["--agent-steps", "4000000"]),
    ("gorila", ["train", "gorila", "--actors", "2", "--eval-episodes", "2", "--timeout", "15"],
     ["--env-steps", "20000"]),
]


def session_pids(sid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != b"Z":  # session id; zombies are already dead
            pids.append(int(entry.name))
    return pids


def popplay(args: list[str], cwd: Path, timeout: float) -> tuple[int | None, str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    process = subprocess.Popen([sys.executable, "-m", "popplay", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = process.communicate(timeout=timeout)
        return process.returncode, err
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return None, "HANG"


def one_kill(name: str, argv: list[str], budget: list[str], workdir: Path, rng: random.Random,
             timeout: float) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    out = workdir / "run.h5"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    process = subprocess.Popen([sys.executable, "-m", "popplay", *argv, *budget, "--out", str(out), "--quiet"],
                               cwd=workdir,
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    before_file = rng.random() < 0.15  # sometimes before the first checkpoint
    deadline = time.monotonic() + timeout
    while not before_file and not out.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(rng.uniform(0.3, 4.0) if not before_file else rng.uniform(0.0, 1.5))
    finished_first = process.poll() is not None
    process.send_signal(signal.SIGKILL)
    process.wait()
    process.stderr.close()
    time.sleep(5.0)  # ranks die with their parent (a parent-death signal), at once
    left = session_pids(process.pid)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    record = {"job": name, "finished_before_the_kill": finished_first, "leftover_pids": len(left),
              "file": out.exists()}
    if not out.exists():
        code, err = popplay(["train", argv[1], "--resume", str(out), *budget], workdir, timeout)
        record.update(cls="NO_FILE" if code == 2 and err.strip().count("\n") == 0 else "FAILED", resume_code=code,
                      resume_error=err.strip()[-300:])
    else:
        code, err = popplay(["train", argv[1], "--resume", str(out), *budget, "--quiet"], workdir, timeout)
        record.update(resume_code=code, resume_error=err.strip()[-300:])
        if code is None:
            record["cls"] = "HANG"
        elif "Traceback" in err or "internal error" in err:
            record["cls"] = "INTERNAL"
        elif code != 0:
            record["cls"] = "FAILED"
        else:
            import h5py

            with h5py.File(out, "r") as f:
                complete = bool(f.attrs.get("complete"))
            record["cls"] = "RESUMED" if complete else "FAILED"
    if finished_first:
        record["cls"] = "ENDED_FIRST"  # the run was over before the kill: no kill to test
    if left:
        record["cls"] = "LEFTOVER"
    temporary = [p.name for p in workdir.iterdir() if ".tmp" in p.name or p.name.endswith(".parts")]
    record["temporary_files"] = temporary
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=3, help="kills per job")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--workdir", type=Path, default=Path("hostile-kills"))
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--jobs", default=",".join(name for name, _, _ in JOBS),
                        help="which jobs, comma separated (default: all)")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    records = []
    started = time.monotonic()
    chosen = [job for job in JOBS if job[0] in args.jobs.split(",")]
    for name, command, budget in chosen:
        for k in range(args.kills):
            record = one_kill(name, command, budget, args.workdir / f"{name.replace(' ', '_')}-{k}", rng, args.timeout)
            records.append(record)
            print(f"{name:18} kill {k}: {record['cls']:8} resume exit {record.get('resume_code')} "
                  f"{record.get('resume_error', '')[-120:]!r}", flush=True)
    counts: dict[str, int] = {}
    for record in records:
        counts[record["cls"]] = counts.get(record["cls"], 0) + 1
    report = {"kills": len(records), "counts": counts, "seconds": round(time.monotonic() - started, 1),
              "records": records}
    print(json.dumps({k: v for k, v in report.items() if k != "records"}))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    bad = sum(counts.get(c, 0) for c in ("LEFTOVER", "INTERNAL", "FAILED", "HANG"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
