"""No code path reaches the network (issue 23.2): importing XBench and a whole tiny run, in a fresh
interpreter whose sockets and name lookups raise, so a dependency that phones home on import (as
albumentations does unless told not to) fails here rather than in a user's air-gapped cluster."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import SUBPROCESS_SAFETY_TIMEOUT

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow  # a fresh interpreter's imports are the point

GUARD = textwrap.dedent(
    """
    import socket

    LOCAL = ("127.", "localhost", "::1")
    real_connect, real_getaddrinfo = socket.socket.connect, socket.getaddrinfo

    def local(host):
        return host is None or (isinstance(host, str) and host.startswith(LOCAL))

    def connect(self, address):
        # Unix sockets and loopback are this machine (W&B's own service listens on one)
        if self.family == socket.AF_UNIX or local(address[0] if isinstance(address, tuple) else address):
            return real_connect(self, address)
        raise SystemExit(f"NETWORK CALL: connect {address!r}")

    def getaddrinfo(host, *args, **kwargs):
        if local(host):
            return real_getaddrinfo(host, *args, **kwargs)
        raise SystemExit(f"NETWORK CALL: name lookup {host!r}")

    socket.socket.connect, socket.getaddrinfo = connect, getaddrinfo
    """
)


def run_guarded(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "XBENCH_CACHE": str(tmp_path / "cache"), "WANDB_MODE": "offline",
           "WANDB_DIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    env.pop("NO_ALBUMENTATIONS_UPDATE", None)  # XBench must set it itself
    return subprocess.run([sys.executable, "-c", GUARD + textwrap.dedent(code)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=SUBPROCESS_SAFETY_TIMEOUT)


def test_a_guarded_interpreter_catches_a_call(tmp_path):
    """The guard itself works: a plain connection attempt ends the interpreter with its message."""
    result = run_guarded("import urllib.request\nurllib.request.urlopen('http://example.invalid')", tmp_path)
    assert result.returncode != 0 and "NETWORK CALL" in result.stderr + result.stdout


def test_import_and_a_tiny_run_touch_no_network(tmp_path):
    result = run_guarded(
        f"""
        from xbench.data.phantom import generate_phantom
        from xbench.test import main
        import sys
        assert "albumentations" in sys.modules  # the import that checked for updates is on this path
        generate_phantom({str(tmp_path / "phantom")!r}, num_images=3, size=48, seed=0)
        main(["--config", {str(REPO / "lightning_configs/models/centre_prior.yaml")!r},
              "--config", {str(REPO / "lightning_configs/data/phantom.yaml")!r},
              "--data.root", {str(tmp_path / "phantom")!r}, "--data.num_images", "3", "--data.native_size", "48",
              "--data.image_size", "32", "--data.num_workers", "0", "--trainer.enable_progress_bar", "false",
              "--results.folder", {str(tmp_path / "results")!r}])
        print("RUN DONE")
        """,
        tmp_path,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "RUN DONE" in output, output[-3000:]
    assert "NETWORK CALL" not in output and "Error fetching version info" not in output
