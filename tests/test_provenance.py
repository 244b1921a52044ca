"""Provenance in every run file: the command as typed, the options given, version,
commit, host, CPU/GPU; shown by `popplay inspect`."""
import json
import shlex
import subprocess
import sys

import h5py

from popplay.cli.main import main

BANDIT = ["train", "bandit", "--arms", "10", "--agents", "8", "--trials", "4", "--agent-steps", "256",
          "--share-every", "16"]


def _attrs(path):
    with h5py.File(path) as f:
        return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}


def test_run_files_record_the_command_and_the_options_as_given(tmp_path, capsys):
    run = tmp_path / "run.h5"
    argv = [*BANDIT, "--out", str(run), "--json"]
    assert main(argv) == 0
    attrs = _attrs(run)
    assert attrs["command_line"] == shlex.join(["popplay", *argv])
    given = json.loads(attrs["given_json"])
    assert given["--agent-steps"] == 256 and given["--agents"] == 8 and given["--json"] is True
    assert "--epsilon" not in given and "--seed" not in given  # defaults are not "given"
    assert attrs["popplay_version"] and attrs["host"] and attrs["cpu"] and attrs["gpu"] == "none"
    assert attrs["cpu_count"] >= 1 and attrs["git_commit"]
    with h5py.File(run) as f:  # the derived config stays beside it
        assert f["config"].attrs["steps_per_agent"] == 32
    capsys.readouterr()
    assert main(["train", "bandit", "--resume", str(run), "--agent-steps", "512", "--json"]) == 0
    capsys.readouterr()
    assert main(["inspect", str(run), "--json"]) == 0
    info = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["provenance"]
    assert info["command_line"].startswith("popplay train bandit --resume")
    assert info["given"] == {"--resume": str(run), "--agent-steps": 512, "--json": True}
    assert info["history"] == [shlex.join(["popplay", *argv])]
    assert main(["inspect", str(run)]) == 0
    shown = capsys.readouterr().out
    assert "resumed from" in shown and "made by" in shown and "popplay train bandit" in shown


def test_a_real_process_records_what_was_typed(tmp_path):
    run = tmp_path / "run.h5"
    done = subprocess.run([sys.executable, "-m", "popplay", *BANDIT, "--out", str(run), "--seed", "5"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    attrs = _attrs(run)
    assert attrs["command_line"] == shlex.join(["popplay", *BANDIT, "--out", str(run), "--seed", "5"])
    assert json.loads(attrs["given_json"])["--seed"] == 5
