"""The console scripts of pyproject.toml: one per command, each exiting 0 when the command succeeds.

pip's generated script runs ``sys.exit(function())``, and ``sys.exit`` takes anything but None or
an int for an error (it prints it and exits 1), so the functions behind the scripts return nothing
or an exit status.
"""

import importlib
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch
import yaml

from conftest import CONFIGS, SUBPROCESS_SAFETY_TIMEOUT, run_args

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
COMMANDS = ("test", "suite", "report", "analyze", "inspect_checkpoint")


def shim(name: str) -> str:
    """The body of the script pip generates for ``name``."""
    module, function = SCRIPTS[name].split(":")
    return f"import sys; from {module} import {function}; sys.exit({function}())"


def exit_status(name: str, args: list[str], monkeypatch) -> int:
    """The status the script ``name`` exits with for ``args``, run in this process."""
    monkeypatch.setattr(sys, "argv", [name, *args])
    with pytest.raises(SystemExit) as exited:
        exec(shim(name), {})
    code = exited.value.code
    return 0 if code is None else code if isinstance(code, int) else 1


def test_every_command_has_a_script():
    assert sorted(SCRIPTS) == sorted(f"xbench-{command.replace('_', '-')}" for command in COMMANDS)
    for name, target in SCRIPTS.items():
        module, function = target.split(":")
        assert module == "xbench." + name.removeprefix("xbench-").replace("-", "_")
        assert callable(getattr(importlib.import_module(module), function))


def oracle_results(phantom_root, monkeypatch) -> None:
    """``results/`` in the current folder: one oracle run, through the ``xbench-test`` script."""
    run = run_args("oracle", "phantom", phantom_root, Path("results"), "--trainer.logger", "false", image_size=32)
    assert exit_status("xbench-test", run, monkeypatch) == 0  # exited 1 after a good run before its fix
    assert len(list(Path("results").glob("oracle__phantom__*/metrics.json"))) == 1


def test_scripts_exit_zero_on_success(phantom_root, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    oracle_results(phantom_root, monkeypatch)
    suite = {"results_dir": "results", "models": [str(CONFIGS / "models" / "oracle.yaml")],
             "datasets": [{"config": str(CONFIGS / "data" / "phantom.yaml"), "settings": {"data.root": str(phantom_root)}}]}
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(suite))
    torch.save({"weight": torch.zeros(2, 3)}, tmp_path / "weights.pt")
    for name, args in [
        ("xbench-report", ["results", "--out", "report"]),
        ("xbench-analyze", ["results", "--out", "analysis", "--replicates", "20"]),
        ("xbench-suite", ["--config", "suite.yaml", "--dry-run"]),
        ("xbench-inspect-checkpoint", ["weights.pt"]),
    ]:
        assert exit_status(name, args, monkeypatch) == 0, name
    assert (tmp_path / "analysis" / "summary.md").is_file()
    assert (tmp_path / "report" / "report.md").is_file()


@pytest.mark.slow  # a process of its own is the point
def test_a_script_exits_zero_in_a_process_of_its_own(phantom_root, tmp_path, monkeypatch):
    """The report's script as a user runs it, in a fresh interpreter (it starts without torch)."""
    monkeypatch.chdir(tmp_path)
    oracle_results(phantom_root, monkeypatch)
    done = subprocess.run([sys.executable, "-c", shim("xbench-report"), "results", "--out", "report"],
                          capture_output=True, text=True, timeout=SUBPROCESS_SAFETY_TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "report" / "report.md").is_file()
