"""The Python API: every example in docs/api.md runs as written; `import popplay` stays cheap."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_docs_api_examples_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # an empty directory: the examples must need nothing there
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "api.md").read_text(), flags=re.S)
    assert len(blocks) >= 4
    for block in blocks:
        exec(compile(block, "docs/api.md", "exec"), {})
    assert (tmp_path / "api-knights.h5").is_file()
    printed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in printed if line.split()[0] in ("none", "explorers", "top2")] == [
        "none", "explorers", "top2"]


def test_api_basics():
    import popplay

    assert popplay.TrainOptions().out is None
    with pytest.raises(ValueError):
        popplay.params_for("bandit", epsilon=2.0)
    with pytest.raises(ValueError):
        popplay.train("bandit", agents=2, trials=2, steps_per_agent=4, checkpoint_every="8")  # needs out
    assert {"train", "evaluate", "tournament", "BanditParams", "KnightsParams"} <= set(dir(popplay))


def test_import_popplay_loads_nothing_heavy():
    code = "import sys, popplay; print(sorted(m for m in ('torch', 'numba', 'numpy', 'h5py') if m in sys.modules))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.stdout.strip() == "[]", done.stderr
