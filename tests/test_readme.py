"""The README's "What you can run" commands, as written, twice in a row in one
directory (tiny sizes appended: a later option overrides an earlier one), through a
real process: with two runs of a domain in runs/, every line must still work."""
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Appended to each command (the README's own options stay; these make it tiny).
TINY = {
    ("train", "bandit"): ["--arms", "10", "--agents", "8", "--trials", "4", "--agent-steps", "128"],
    ("train", "knights"): ["--agents", "8", "--games-per-agent", "2", "--episodes", "2", "--eval-every", "1",
                           "--eval-games", "2", "--max-turns", "20"],
    ("train", "cartpole"): ["--agents", "4", "--trials", "2", "--agent-steps", "256", "--share-every", "16",
                            "--test-steps", "50"],
    ("tournament",): ["--games", "2"],
}
RUNNER = """
import json, shlex, sys
from popplay.cli.main import main
codes = []
for line in json.loads(sys.argv[1]):
    print("$ popplay " + line, file=sys.stderr, flush=True)
    codes.append(main(shlex.split(line)))
print(json.dumps(codes))
"""


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## What you can run"):text.index("### Bandit populations")]
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", section, flags=re.S):
        for line in block.splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith("popplay "):
                commands.append(line[len("popplay "):])
    return commands


def tiny(command: str) -> str:
    words = shlex.split(command)
    if words[:2] == ["train", "bandit"] and "--resume" in words:
        extra = ["--agent-steps", "256"]  # only the budget may change on resume
    else:
        extra = next((v for k, v in TINY.items() if tuple(words[:len(k)]) == k), [])
        if words[0] == "evaluate" and "--games" in words:  # knights only
            extra = ["--games", "4"]
        if "--time-budget" in words:
            extra = [*extra, "--time-budget", "0.5"]
    return shlex.join(words + extra)


def test_every_readme_command_works_twice_in_a_row(tmp_path):
    commands = readme_commands()
    assert len(commands) >= 12 and any("latest-knights.h5" in c for c in commands)
    assert all("*" not in c for c in commands)  # a glob breaks as soon as a domain has two runs
    lines = [tiny(c) for c in commands] * 2
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "COLUMNS": "120"}
    done = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(lines)], input="quit\n" * 4,
                          capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    codes = json.loads(done.stdout.strip().splitlines()[-1])
    failed = [(line, code) for line, code in zip(lines, codes) if code != 0]
    assert not failed, (failed, done.stderr[-3000:])
    runs = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert sum(name.startswith("bandit-") for name in runs) == 6  # three trainings per pass
    for domain in ("bandit", "knights", "cartpole"):
        link = tmp_path / "runs" / f"latest-{domain}.h5"
        assert link.is_symlink() and (tmp_path / "runs" / os.readlink(link)).is_file()
