"""One job of a suite: its pairs in one process, ``python -m xbench.suite_worker < REQUEST``.

Started by ``xbench.suite``, never by hand: as a process of this machine, or as a SLURM job
through submitit (`run_submitted`, the same loop). REQUEST (JSON, on stdin: LightningCLI
warns when the command line holds arguments beside the ones it is given) names an ``outcomes``
file and lists the ``jobs``, each ``{"number", "total", "name", "args"}`` with ``args`` the pair's
``xbench.test`` arguments. They run in turn through `xbench.test.run_test`, which reuses the
model (its weights loaded once) while its settings stay the same. A pair that raises is reported and
the next one runs. JSON lines go to the outcomes file: ``started`` before each pair, ``progress``
with the images it has scored (every ``PROGRESS_SECONDS``), then ``ok`` or ``failed`` with the
results folder or the error; so if this process dies the suite knows which pair it was running
and which never ran, and a person can follow a job that runs out of sight. A SLURM job's request
also names the file its suite touches while it follows the job (``launcher_alive``) and how long
it may stay untouched (``watchdog_seconds``) before the job ends itself.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from lightning.pytorch import Callback
from rich.console import Console

from xbench.cli import error_line, quiet_notices, return_large_frees_to_the_system, run
from xbench.test import LoadedModel, run_test

NAME = "xbench-test"  # what a failed pair's line starts with, as in a pair's own process
COMMAND = "xbench-suite-worker"  # what this process's own lines start with
#: How often a running pair notes its images done.
PROGRESS_SECONDS = 10.0


class ImagesDone(Callback):
    """Counts the images a run has scored and passes the count to ``note`` every ``PROGRESS_SECONDS``."""

    def __init__(self, note) -> None:
        self.note, self.images, self.noted = note, 0, time.monotonic()

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self.images += len(batch["index"])
        if time.monotonic() - self.noted >= PROGRESS_SECONDS:
            self.note(self.images)
            self.noted = time.monotonic()


def run_jobs(request: dict) -> int:
    """Run every job of ``request``; the exit status is 1 if any pair failed."""
    console, loaded, failed = Console(), LoadedModel(), False
    with open(request["outcomes"], "a", encoding="utf-8") as outcomes:

        def record(job: dict, state: str, detail: str = "", images: int | None = None) -> None:
            line = {"number": job["number"], "state": state, "detail": detail}
            outcomes.write(json.dumps(line if images is None else {**line, "images": images}) + "\n")
            outcomes.flush()

        for job in request["jobs"]:
            console.rule(f"[bold][{job['number']}/{job['total']}] {job['name']}")
            record(job, "started")
            progress = ImagesDone(lambda images, job=job: record(job, "progress", images=images))
            try:
                _, path = run_test(job["args"], loaded, callbacks=[progress])
            except Exception as error:  # noqa: BLE001 -- a pair's failure is reported; the next pair runs
                if os.environ.get("XBENCH_DEBUG") == "1":
                    traceback.print_exc()
                line = error_line(NAME, error)
                print(line, file=sys.stderr, flush=True)
                record(job, "failed", line, progress.images)
                failed = True
                continue
            record(job, "ok", str(path) if path is not None else "(no results folder written)", progress.images)
    return 1 if failed else 0


def watch_launcher(alive: Path, seconds: float) -> None:
    """End this process (SIGKILL, as Lightning runs on after a SIGTERM) once its launcher has left
    ``alive`` untouched for ``seconds``: a SLURM job runs where no signal from a launcher that died
    reaches it. A thread, looking ten times in ``seconds`` (at most every 10 s)."""

    def watch() -> None:
        seen, since = None, time.monotonic()
        while True:
            try:
                touched = alive.stat().st_mtime_ns
            except OSError:  # not there (yet, on a slow shared file system): as untouched
                touched = seen
            if touched != seen:
                seen, since = touched, time.monotonic()
            elif time.monotonic() - since > seconds:
                print(f"{COMMAND}: its suite has not been seen for {seconds:.0f} s "
                      f"({alive} untouched): it was stopped, so this job ends", file=sys.stderr, flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(min(seconds / 10, 10.0))

    threading.Thread(target=watch, daemon=True, name="xbench-watchdog").start()


def run_submitted(request: dict) -> int:
    """A suite's job as submitit runs it (a SLURM job, or its local executor): in the folder the
    suite was started from, with the settings of XBench's commands, ended by its watchdog if the
    suite is gone."""
    watch_launcher(Path(request["launcher_alive"]), request["watchdog_seconds"])
    os.chdir(request["cwd"])
    if os.environ.get("XBENCH_DEBUG") != "1":
        quiet_notices()
    return_large_frees_to_the_system()
    return run_jobs(request)


def main() -> int:
    """Run the jobs read from stdin."""
    return run_jobs(json.load(sys.stdin))


if __name__ == "__main__":
    run(main, COMMAND)
