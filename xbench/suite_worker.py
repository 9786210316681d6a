"""One model's pairs of a suite in one process: ``python -m xbench.suite_worker < JOBS``.

Started by ``xbench.suite`` in its per-model mode, never by hand. JOBS (JSON, on stdin: LightningCLI
warns when the command line holds arguments beside the ones it is given) names an ``outcomes`` file
and lists the ``jobs``, each ``{"number", "total", "name", "args"}`` with ``args`` the pair's
``xbench.test`` arguments. They run in turn through :func:`xbench.test.run_test`, which reuses the
model (its weights loaded once) while its settings stay the same. A pair that raises is reported and
the next one runs. Around each pair a JSON line goes to the outcomes file (``started``, then ``ok``
or ``failed`` with the results folder or the error), so that if this process dies the suite knows
which pair it was running and which never ran.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

from rich.console import Console

from xbench.cli import error_line, run
from xbench.test import LoadedModel, run_test

NAME = "xbench-test"  # what a failed pair's line starts with, as in a pair's own process


def main() -> int:
    """Run every job read from stdin; the exit status is 1 if any pair failed."""
    request = json.load(sys.stdin)
    console, loaded, failed = Console(), LoadedModel(), False
    with open(request["outcomes"], "a", encoding="utf-8") as outcomes:

        def record(job: dict, state: str, detail: str = "") -> None:
            outcomes.write(json.dumps({"number": job["number"], "state": state, "detail": detail}) + "\n")
            outcomes.flush()

        for job in request["jobs"]:
            console.rule(f"[bold][{job['number']}/{job['total']}] {job['name']}")
            record(job, "started")
            try:
                _, path = run_test(job["args"], loaded)
            except Exception as error:  # noqa: BLE001 -- a pair's failure is reported; the next pair runs
                if os.environ.get("XBENCH_DEBUG") == "1":
                    traceback.print_exc()
                line = error_line(NAME, error)
                print(line, file=sys.stderr, flush=True)
                record(job, "failed", line)
                failed = True
                continue
            record(job, "ok", str(path) if path is not None else "(no results folder written)")
    return 1 if failed else 0


if __name__ == "__main__":
    run(main, "xbench-suite-worker")
