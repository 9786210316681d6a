"""Where a suite's jobs run, and the lines a person follows them by.

A job is the pairs one process runs: a model's pairs (per-model mode) or one pair (per-pair mode)
in ``xbench.suite_worker``; a pair whose trainer starts processes of its own (several devices or
nodes) alone in ``python -m xbench.test``. Jobs run

- ``--launcher local`` (the default): one after another on this machine, their output on the
  terminal;
- ``--launcher local --devices N``: up to N at once, each pinned to a device of its own -- a GPU
  (``CUDA_VISIBLE_DEVICES``), or without one an equal share of the CPU cores (the process's
  affinity, and as many torch threads); a job that starts processes of its own runs after the
  others, alone, on every device;
- ``--launcher slurm``: each a SLURM job through submitit, with the resources of the suite file's
  ``slurm:`` block (`parse_slurm`), in the environment and the folder the suite was started
  from.

Jobs that run at once start longest first (``xbench.costs``). Every job's outcome comes from the
file its worker notes each pair in, so each launcher reports the same: a job that dies fails the
pair it was running and leaves its later pairs not run. Outside the terminal a job's output goes
to its log file under ``<results_dir>/.suite/<time>/`` (a hidden folder, which readers of results
do not look into; on a cluster the nodes see it, as they see the results). ``Ctrl-C`` cancels
every job started or submitted and stops. A job dies with its launcher (on this machine Linux's
parent-death signal, under SLURM a watchdog), and one launcher at a time runs pairs in a results
folder ([`results_lock`][xbench.launch.results_lock]): docs/large-runs.md says why so.
"""

from __future__ import annotations

import codecs
import ctypes
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from xbench.costs import longest_first
from xbench.results.folder import find_result_folders

LAUNCHERS = ("local", "slurm")
#: The folder under ``results_dir`` of each launch's logs and outcome files (hidden: not results).
JOBS_FOLDER = ".suite"
#: The file in ``JOBS_FOLDER`` a launcher holds locked while it runs pairs in ``results_dir``.
LOCK = "lock"
#: The submitit cluster of ``--launcher slurm``. The tests set ``"local"``: submitit's local
#: executor, the same path without sbatch.
CLUSTER = "slurm"
#: How often jobs are checked, and at least how long between two lines of one job's images done.
POLL_SECONDS = 1.0
PROGRESS_LINE_SECONDS = 60.0
#: How long cancelled jobs have, all together, to stop on their SIGINT before a SIGKILL.
CANCEL_SECONDS = 10.0
#: A SLURM job's watchdog: the launcher touches this file of its launch's folder at every check of
#: its jobs; a job that sees it untouched for WATCHDOG_SECONDS (by its own clock; a shared file
#: system may show a file's time a minute late) ends itself, as no signal reaches it from a
#: launcher that died.
LAUNCHER_ALIVE = "launcher.alive"
WATCHDOG_SECONDS = 300.0

# -- the suite file's slurm: block -------------------------------------------------------------

SLURM_KEYS = ("partition", "gpus_per_task", "cpus_per_task", "mem", "time", "sbatch")
#: sbatch options XBench or submitit set (one task per job, its name, its log, the signal before the
#: time limit, the suite's environment) or the block names itself (``gpus``: its ``gpus_per_task``):
#: not in its ``sbatch:`` mapping, nor any start of their names (sbatch takes ``--out`` for ``--output``).
SET_OPTIONS = ("partition", "gpus", "gpus-per-task", "cpus-per-task", "mem", "time", "job-name", "nodes", "ntasks",
               "ntasks-per-node", "output", "error", "open-mode", "signal", "array", "export")
MEMORY = re.compile(r"\d+[KMGT]?")
TIME = re.compile(r"(?:(\d+)-)?(\d+):(\d\d):(\d\d)")
OPTION = re.compile(r"[a-z][a-z0-9_-]*")
NAME = r"[A-Za-z0-9_.-]+"
NAMES = re.compile(rf"{NAME}(?:,{NAME})*")
#: What an ``sbatch:`` value may be where its format is known, and what that format is; any other
#: option takes a WORD. The script quotes each value, but a suite file carries settings, never code.
VALUE_FORMATS = {
    "account": (NAMES, "an account's name (letters, digits, _ . -)"),
    "qos": (NAMES, "a QOS's name (letters, digits, _ . -)"),
    "reservation": (NAMES, "reservations' names (letters, digits, _ . -), joined by commas"),
    "wckey": (NAMES, "a workload key's name (letters, digits, _ . -)"),
    "gres": (re.compile(rf"{NAME}(?::{NAME})*(?:,{NAME}(?::{NAME})*)*"),
             "generic resources as SLURM writes them, name[:type][:count] joined by commas (gpu:a100:2)"),
    "time-min": (re.compile(r"\d+(?::\d\d){0,2}|\d+-\d+(?::\d\d){0,2}"),
                 "a time as SLURM writes it: minutes (90) or [days-]hours:minutes:seconds (1:30:00)"),
    "mem-per-cpu": (MEMORY, "memory as SLURM writes it: megabytes, or a number with K, M, G or T (4G)"),
    "mem-per-gpu": (MEMORY, "memory as SLURM writes it: megabytes, or a number with K, M, G or T (4G)"),
    "mail-user": (re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+"), "an e-mail address"),
    "constraint": (re.compile(r"[A-Za-z0-9_.,:&|*()\[\]-]+"),
                   "node features joined by & | , (with [ ] ( ) * where SLURM's syntax has them), no spaces"),
}
WORD = (re.compile(r"[A-Za-z0-9_.,:@%+=/-]+"),
        "one word: letters, digits and _ . , : @ % + = / -, no spaces, quotes or other shell characters")


@dataclass(frozen=True)
class SlurmResources:
    """What each job of the suite asks SLURM for."""

    minutes: int
    partition: str | None = None
    gpus_per_task: int = 0
    cpus_per_task: int | None = None
    mem: str | None = None
    sbatch: dict[str, Any] = field(default_factory=dict)


def _count(value: Any, where: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{where} must be a whole number, at least {least}; got {value!r}")
    return value


def _minutes(value: Any, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    match = TIME.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError(f"{where} is how long one job may run: minutes (240) or [days-]hours:minutes:seconds "
                         f"(4:00:00, 1-12:00:00); got {value!r}")
    days, hours, minutes, seconds = (int(part or 0) for part in match.groups())
    total = ((days * 24 + hours) * 60 + minutes) + (seconds > 0)
    if total == 0:
        raise ValueError(f"{where} must be more than nothing; got {value!r}")
    return total


def _sbatch_option(key: Any, value: Any, where: str) -> None:
    """One ``sbatch:`` entry: an option's long name that reaches no option XBench sets, and a value
    of its option's format (a flag: ``true``)."""
    if not isinstance(key, str) or not OPTION.fullmatch(key):
        raise ValueError(f"{where}: {key!r} is not an sbatch option's long name (account, qos, constraint): "
                         "lowercase letters, digits, - and _, without the leading --")
    name = key.replace("_", "-")
    reached = [option for option in SET_OPTIONS if option.startswith(name)]
    if reached:
        what = f"--{name}" if name in reached else \
            f"the start of --{' or --'.join(reached)} (sbatch takes it for the whole name)"
        raise ValueError(f"{where}: {key} is {what}, an option XBench sets (one task per job, its name, log and "
                         f"environment) or the block's own keys set ({', '.join(SLURM_KEYS[:-1])}): leave it out")
    if value is True:
        return
    pattern, form = VALUE_FORMATS.get(name, WORD)
    if isinstance(value, bool) or not isinstance(value, str | int) or not pattern.fullmatch(str(value)):
        raise ValueError(f"{where}.{key} must be {form}, a number, or true (a flag); got {value!r}")


def parse_slurm(raw: Any, where: str) -> SlurmResources:
    """The suite file's ``slurm:`` block, every key and value checked (``where``: the file, for the
    message)::

        slurm: {partition: gpu, gpus_per_task: 1, cpus_per_task: 8, mem: 64G, time: "4:00:00",
                sbatch: {account: mylab, qos: normal}}

    ``time`` is required (submitit would otherwise give each job 5 minutes); ``mem`` is SLURM's
    (``64G``, a number of megabytes); ``sbatch`` holds any other ``#SBATCH --option=value``, each
    value of its option's format (``VALUE_FORMATS``), else one word."""
    where = f"{where}: slurm"
    if not isinstance(raw, dict):
        raise ValueError(f"{where} must be a mapping of {', '.join(SLURM_KEYS)}; got {raw!r}")
    unknown = sorted(map(repr, set(raw) - set(SLURM_KEYS)))
    if unknown:
        raise ValueError(f"{where}: unknown keys [{', '.join(unknown)}]; it has {list(SLURM_KEYS)} (other sbatch "
                         "options go in its sbatch: mapping, e.g. sbatch: {account: mylab})")
    if "time" not in raw:
        raise ValueError(f"{where}.time is missing: how long one job (a model's pairs) may run, e.g. time: \"4:00:00\"")
    partition = raw.get("partition")
    if partition is not None and (not isinstance(partition, str) or not NAMES.fullmatch(partition)):
        raise ValueError(f"{where}.partition must be a partition's name (letters, digits, _ . -), or several joined "
                         f"by commas; got {partition!r}")
    mem = raw.get("mem")
    if mem is not None:
        if isinstance(mem, int) and not isinstance(mem, bool) and mem >= 0:
            mem = str(mem)
        if not isinstance(mem, str) or not MEMORY.fullmatch(mem):
            raise ValueError(f"{where}.mem is the memory of a job as SLURM writes it: megabytes, or a number with "
                             f"K, M, G or T (64G); got {raw['mem']!r}")
    sbatch = raw.get("sbatch") or {}
    if not isinstance(sbatch, dict):
        raise ValueError(f"{where}.sbatch must map sbatch options to values, e.g. {{account: mylab}}; got {sbatch!r}")
    for key, value in sbatch.items():
        _sbatch_option(key, value, f"{where}.sbatch")
    return SlurmResources(
        minutes=_minutes(raw["time"], f"{where}.time"),
        partition=partition,
        gpus_per_task=_count(raw.get("gpus_per_task", 0), f"{where}.gpus_per_task", 0),
        cpus_per_task=None if raw.get("cpus_per_task") is None else _count(raw["cpus_per_task"], f"{where}.cpus_per_task", 1),
        mem=mem,
        sbatch=dict(sbatch),
    )


def describe(resources: SlurmResources) -> str:
    """The resources in words, the ``sbatch:`` options as the job's script has them (submitit writes them)."""
    from submitit.slurm.slurm import _as_sbatch_flag

    parts = [f"partition {resources.partition}" if resources.partition else "the default partition",
             f"{resources.gpus_per_task} GPU(s)" if resources.gpus_per_task else "no GPU"]
    parts += [f"{resources.cpus_per_task} CPUs"] if resources.cpus_per_task else []
    parts += [f"memory {resources.mem}"] if resources.mem else []
    parts += [f"{resources.minutes} min"]
    parts += [_as_sbatch_flag(key, value).removeprefix("#SBATCH ") for key, value in resources.sbatch.items()]
    return ", ".join(parts)


def submitit_executor(folder: Path, resources: SlurmResources):
    """submitit's executor for the suite's jobs, their resources set; its logs in ``folder``."""
    import submitit

    try:
        executor = submitit.AutoExecutor(folder=folder, cluster=CLUSTER)
    except RuntimeError as error:  # SlurmExecutor: no srun here
        raise RuntimeError(f"--launcher slurm: {error} Start the suite where sbatch and srun run (a cluster's login "
                           "node), or use --launcher local") from None
    parameters: dict[str, Any] = {"timeout_min": resources.minutes, "nodes": 1, "tasks_per_node": 1,
                                  "stderr_to_stdout": True}
    if resources.cpus_per_task is not None:
        parameters["cpus_per_task"] = resources.cpus_per_task
    if resources.partition is not None:
        parameters["slurm_partition"] = resources.partition
    if resources.gpus_per_task:
        parameters["slurm_gpus_per_task"] = resources.gpus_per_task
    if resources.mem is not None:
        parameters["slurm_mem"] = resources.mem
    # the suite's environment (PYTHONPATH, XBENCH_CACHE, W&B's settings) whatever the cluster's default
    parameters["slurm_additional_parameters"] = {"export": "ALL", **resources.sbatch}
    executor.update_parameters(**parameters)
    return executor


# -- devices of this machine -------------------------------------------------------------------


@dataclass(frozen=True)
class Slot:
    """A device a local job is pinned to: its environment, its CPU cores (``None``: all), its name."""

    env: dict[str, str]
    cores: frozenset[int] | None
    name: str


def _ranges(cores: list[int]) -> str:
    spans: list[list[int]] = []
    for core in cores:
        if spans and core == spans[-1][1] + 1:
            spans[-1][1] = core
        else:
            spans.append([core, core])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def cpu_shares(count: int, cores: list[int]) -> list[list[int]]:
    """``cores`` in ``count`` contiguous shares as equal as they go (the first ones smaller)."""
    return [cores[i * len(cores) // count:(i + 1) * len(cores) // count] for i in range(count)]


def device_slots(count: int) -> list[Slot]:
    """``count`` devices for jobs run at once: this machine's GPUs (those ``CUDA_VISIBLE_DEVICES``
    shows), or without one, shares of the CPU cores this process may use."""
    if count == 1:
        return [Slot({}, None, "")]
    import torch

    if torch.cuda.is_available():
        shown = os.environ.get("CUDA_VISIBLE_DEVICES")
        gpus = [g.strip() for g in shown.split(",") if g.strip()] if shown else list(map(str, range(torch.cuda.device_count())))
        if count > len(gpus):
            raise ValueError(f"--devices {count}: this machine shows {len(gpus)} GPU(s) ({', '.join(gpus)})")
        return [Slot({"CUDA_VISIBLE_DEVICES": gpu}, None, f"GPU {gpu}") for gpu in gpus[:count]]
    pinning = hasattr(os, "sched_setaffinity")
    cores = sorted(os.sched_getaffinity(0)) if pinning else list(range(os.cpu_count() or 1))
    if count > len(cores):
        raise ValueError(f"--devices {count}: no GPU here, and {len(cores)} CPU core(s) to share; at most "
                         f"--devices {len(cores)}")
    return [Slot({"OMP_NUM_THREADS": str(len(share))}, frozenset(share) if pinning else None,
                 f"CPU cores {_ranges(share)}") for share in cpu_shares(count, cores)]


# -- jobs --------------------------------------------------------------------------------------


@dataclass
class Job:
    """The pairs one process runs. ``tasks``: each pair's ``{"number", "total", "name", "args"}`` (its
    ``xbench.test`` arguments); ``labels``: what the job's lines call each pair; ``worker``: run by
    ``xbench.suite_worker``, else alone by ``xbench.test`` (it starts processes of its own)."""

    number: int
    label: str
    pairs: list
    tasks: list[dict]
    labels: list[str]
    worker: bool = True
    estimate: float | None = None


#: A pair's outcome: ``ok`` (detail: its results folder), ``failed`` (the error) or ``not run``.
Outcome = tuple[Any, str, str]


def _last_line(text: str) -> str:
    return next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "")


#: Linux's ``prctl`` option that has the kernel send a signal to a process when the thread that
#: started it ends (``man 2 prctl``).
PR_SET_PDEATHSIG = 1


def _bound_to(launcher: int):
    """What a job's process does before it runs its command (in the child, between fork and exec).

    It sets SIGINT to its default and holds it back (the default and a signal mask survive exec)
    until the command's wrapper is ready to end on one line ([`run`][xbench.cli.run] lets it
    through): a ``Ctrl-C`` that cancels a job while Python starts or imports is pending, not a
    traceback. Set, not inherited: a launcher started where SIGINT is ignored (a background job of
    a shell without job control: a script's ``&``, a CI runner's) would pass that on through exec,
    and its jobs would hear a cancel only as the SIGKILL after it; a job's own session keeps a
    terminal's ``Ctrl-C`` from it either way, so the one SIGINT it hears is the cancel. And on
    Linux it asks for SIGKILL when the launcher's thread ends, by a ``kill -9`` too: a job never
    outlives its launcher. SIGKILL, not SIGTERM, as Lightning's trainer notes a SIGTERM and runs
    on; the parent's id is compared after the call, for a launcher that died before it."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None

    def before_exec() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != launcher:
                os._exit(1)

    return before_exec


class LocalRun:
    """A job as a process of this machine: its output on the terminal (``log`` None) or in its log."""

    def __init__(self, job: Job, request: Path, log: Path | None, results_dir: Path) -> None:
        self.job, self.request, self.log, self.results_dir = job, request, log, results_dir
        self.process: subprocess.Popen | None = None
        self.tail: deque[str] = deque(maxlen=50)
        self.before: set[Path] = set()
        self.reader: threading.Thread | None = None

    @property
    def started(self) -> bool:
        return self.process is not None

    def start(self, slot: Slot) -> str:
        command = [sys.executable, "-m", "xbench.suite_worker"] if self.job.worker else [
            sys.executable, "-m", "xbench.test", *self.job.tasks[0]["args"]]
        if not self.job.worker:
            self.before = set(result_folders(self.results_dir))
        stdin = self.request.open() if self.job.worker else None
        output = self.log.open("w") if self.log is not None else None
        try:
            # a session of its own: Ctrl-C reaches the suite, which stops each job (and its DataLoader workers)
            self.process = subprocess.Popen(
                command, stdin=stdin, stdout=output, stderr=subprocess.STDOUT if output else subprocess.PIPE,
                env={**os.environ, **slot.env}, start_new_session=True, preexec_fn=_bound_to(os.getpid()))
        finally:
            for file in (stdin, output):
                if file is not None:
                    file.close()
        if slot.cores is not None:
            os.sched_setaffinity(self.process.pid, slot.cores)  # before its threads and workers start
        if self.log is None:
            self.reader = threading.Thread(target=self._pass_on, daemon=True)
            self.reader.start()
        return f"started on {slot.name}" if slot.name else "started"

    def _pass_on(self) -> None:
        """The job's stderr onto ours as it comes, its last lines kept for the message if it dies."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        for chunk in iter(lambda: self.process.stderr.read1(4096), b""):
            text = decoder.decode(chunk)
            sys.stderr.write(text)
            sys.stderr.flush()
            self.tail.extend(text.splitlines())

    def ended(self) -> bool:
        if self.process.poll() is None:
            return False
        if self.reader is not None:
            self.reader.join()  # all its output passed on before the line that says it ended
        return True

    def last_line(self) -> str:
        if self.reader is not None:
            return _last_line("\n".join(self.tail))
        return _last_line(self.log.read_text(errors="replace")[-20000:])

    def death(self) -> str:
        """How its process ended, for the pairs it did not finish."""
        status = self.process.returncode
        if status < 0:
            return f"its worker was killed by {signal.Signals(-status).name}"
        return f"its worker died (exit status {status}: {self.last_line()})"

    def pair_outcome(self) -> tuple[str, str]:
        """The outcome of a job run by ``xbench.test``: its exit status and the folder it wrote."""
        status = self.process.returncode
        if status != 0:
            return "failed", f"exit status {status}: {self.last_line()}"
        new = [folder for folder in result_folders(self.results_dir) if folder not in self.before]
        return "ok", str(new[-1]) if new else "(no results folder written)"

    def cancel(self) -> None:
        """SIGINT to its session (a clean stop: W&B and Lightning close); it does not wait, so every
        job hears the Ctrl-C at once ([`reap`][xbench.launch.LocalRun.reap] waits)."""
        self._signal(signal.SIGINT)

    def reap(self, deadline: float) -> None:
        """Wait for the cancelled job until ``deadline`` (``time.monotonic``), then SIGKILL its session
        (a job that does not end on its SIGINT: stuck in native code, or in a pair's own handler)."""
        if self.process is None:
            return
        try:
            self.process.wait(timeout=max(deadline - time.monotonic(), 0))
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.process.wait()

    def _signal(self, sig: signal.Signals) -> None:
        if self.process is not None:
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:  # it has ended
                pass


@contextmanager
def _starting_with_sigint() -> Iterator[None]:
    """While it lasts, the processes this one starts begin with SIGINT at its default, as
    `_bound_to` gives a local job, where XBench does not start them itself (submitit's local job,
    which its cancel stops by SIGINT). Where this process ignores SIGINT it catches it instead, with
    a handler that does nothing: to this process the same, but exec resets a caught signal to its
    default where it passes an ignored one on. (submitit's local jobs stay in this process's group,
    so a terminal's ``Ctrl-C`` reaches them too: the tests' path, not a cluster's.)"""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        yield
        return
    signal.signal(signal.SIGINT, _unheard)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _unheard(signum, frame) -> None:
    """SIGINT caught and dropped: ignored, but not passed on through exec (`_starting_with_sigint`)."""


class SubmititRun:
    """A job submitted through submitit; its output in submitit's log of the job."""

    def __init__(self, job: Job, request: dict, executor) -> None:
        self.job, self.request, self.executor = job, request, executor
        self.handle = None
        self.log: Path | None = None

    @property
    def started(self) -> bool:
        return self.handle is not None

    def start(self, slot: Slot) -> str:
        from xbench.suite_worker import run_submitted  # the job's entry point (imports Lightning)

        self.executor.update_parameters(name=f"xbench-{_safe_name(self.job.label)}")
        with _starting_with_sigint():  # submitit's local executor starts the job's processes here
            self.handle = self.executor.submit(run_submitted, self.request)
        self.log = self.handle.paths.stdout
        return f"submitted as job {self.handle.job_id}"

    def ended(self) -> bool:
        return self.handle.done()

    def death(self) -> str:
        return f"its job {self.handle.job_id} ended early (state {self.handle.state})"

    def cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel(check=False)

    def reap(self, deadline: float) -> None:
        """Nothing to wait for: the scheduler ends a cancelled job."""


def result_folders(results_dir: Path) -> list[Path]:
    """Every results folder under ``results_dir`` (none while it does not exist)."""
    return find_result_folders([results_dir]) if results_dir.is_dir() else []


@dataclass
class Tracked:
    """A job and what its lines have said of it so far."""

    job: Job
    run: LocalRun | SubmititRun
    outcomes: Path | None
    slot: Slot | None = None
    offset: int = 0
    states: dict[int, tuple[str, str]] = field(default_factory=dict)
    said: float = 0.0  # when its last line was printed


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


class Launch:
    """Runs jobs, at most ``capacity`` at once, each on a free slot, printing a line at each step of
    each job; ``quiet_pairs``: no line per pair (their output is on the terminal)."""

    def __init__(self, console: Console, total_jobs: int, quiet_pairs: bool, alive: Path | None = None) -> None:
        self.console, self.total_jobs, self.quiet_pairs, self.alive = console, total_jobs, quiet_pairs, alive
        self.finished = self.failed = 0

    def say(self, tracked: Tracked, text: str) -> None:
        job = tracked.job
        self.console.print(f"[bold]\\[job {job.number}/{self.total_jobs}] {escape(job.label)}[/bold]: {text}",
                           highlight=False, soft_wrap=True)  # one line, however long its log's path

    def read(self, tracked: Tracked) -> None:
        """New lines of the job's outcomes file; a line for each pair started and ended, and for its
        images done at most every PROGRESS_LINE_SECONDS."""
        if tracked.outcomes is None or not tracked.outcomes.exists():
            return
        with tracked.outcomes.open("rb") as file:
            file.seek(tracked.offset)
            data = file.read()
        complete = data[:data.rfind(b"\n") + 1]
        tracked.offset += len(complete)
        first = tracked.job.tasks[0]["number"]
        for line in complete.decode("utf-8").splitlines():
            record = json.loads(line)
            number, state = record["number"], record["state"]
            index = number - first
            name = escape(tracked.job.labels[index])
            of = f" ({index + 1} of {len(tracked.job.tasks)})" if len(tracked.job.tasks) > 1 else ""
            if state == "progress":
                if not self.quiet_pairs and time.monotonic() - tracked.said >= PROGRESS_LINE_SECONDS:
                    self.say(tracked, f"running {name}{of}, {record['images']:,} images done")
                    tracked.said = time.monotonic()
                continue
            tracked.states[number] = (state, record["detail"])
            if self.quiet_pairs:
                continue
            if state == "started":
                self.say(tracked, f"running {name}{of}")
                tracked.said = time.monotonic()
            elif state == "ok":
                self.say(tracked, f"{name} ok, {record.get('images', 0):,} images")
            else:
                self.say(tracked, f"{name} [red]failed[/red]: {escape(record['detail'])}")

    def outcomes(self, tracked: Tracked) -> list[Outcome]:
        """Each pair's outcome once the job ended, and the job's last line."""
        job, run = tracked.job, tracked.run
        where = f"; log: {run.log}" if run.log is not None else ""
        if not job.worker:
            state, detail = run.pair_outcome()
            results = [(job.pairs[0], state, detail + (where if state != "ok" else ""))]
        else:
            self.read(tracked)
            died = None
            results = []
            for task, pair in zip(job.tasks, job.pairs):
                state, detail = tracked.states.get(task["number"], ("not run", ""))
                if state in ("started", "not run"):
                    died = died or run.death()
                    detail = f"{died} {'while running it' if state == 'started' else 'before it'}{where}"
                    state = "failed" if state == "started" else "not run"
                results.append((pair, state, detail))
        ok = sum(state == "ok" for _, state, _ in results)
        if ok == len(results):
            self.finished += 1
            self.say(tracked, f"[green]finished[/green], {ok} of {len(results)} pair(s) ok")
        else:
            self.failed += 1
            lost = next(detail for _, state, detail in results if state != "ok")
            self.say(tracked, f"[red]failed[/red], {ok} of {len(results)} pair(s) ok: {escape(lost)}"
                     + ("" if not where or lost.endswith(where) else escape(where)))
        return results

    def run(self, tracked_jobs: list[Tracked], slots: list[Slot], capacity: int) -> list[Outcome]:
        """Start each job as a slot frees (a job outside the worker alone, after the others), follow
        them to their end; Ctrl-C cancels what was started and stops."""
        waiting, free, running, results = deque(tracked_jobs), list(slots), [], []
        for tracked in waiting:
            self.say(tracked, f"queued ({len(tracked.job.tasks)} pair(s))")
        try:
            while waiting or running:
                if self.alive is not None:
                    self.alive.touch()  # the jobs' watchdogs see the launcher alive
                while waiting and self._may_start(waiting[0], running, capacity):
                    tracked = waiting.popleft()
                    tracked.slot = free.pop(0) if tracked.job.worker else Slot({}, None, "")
                    running.append(tracked)  # first: a Ctrl-C while it starts cancels it too
                    self.say(tracked, tracked.run.start(tracked.slot))
                for tracked in list(running):
                    self.read(tracked)
                    if tracked.run.ended():
                        results += self.outcomes(tracked)
                        running.remove(tracked)
                        if tracked.job.worker:
                            free.append(tracked.slot)
                if running:
                    time.sleep(POLL_SECONDS)
        except BaseException as error:  # Ctrl-C, or a submission that failed: nothing left running unwatched
            for tracked in running:
                tracked.run.cancel()
                self.say(tracked, "[red]cancelled[/red]")
            deadline = time.monotonic() + CANCEL_SECONDS
            for tracked in running:
                tracked.run.reap(deadline)
            for tracked in waiting:
                self.say(tracked, "[red]not started[/red]")
            why = "Interrupted" if isinstance(error, KeyboardInterrupt) else f"Stopped ({type(error).__name__})"
            self.console.print(f"[red]{why}: {len(running)} job(s) cancelled, {len(waiting)} not started; the pairs "
                               "that finished keep their results (a re-run skips them).")
            raise
        return results

    @staticmethod
    def _may_start(tracked: Tracked, running: list[Tracked], capacity: int) -> bool:
        if any(not other.job.worker for other in running):
            return False
        return len(running) < capacity if tracked.job.worker else not running


def _make_folders(folder: Path) -> list[Path]:
    """Make ``folder`` and its missing parents; those it made, the deepest first."""
    missing = [path for path in (folder, *folder.parents) if not path.exists()]
    folder.mkdir(parents=True, exist_ok=True)
    return missing


def _remove_empty(folders: list[Path]) -> None:
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:  # not empty: a launch's logs or results are in it, and in its parents
            return


@contextmanager
def results_lock(results_dir: Path, suite_file: Path) -> Iterator[None]:
    """Hold ``results_dir`` for one launcher, from its plan to its last job's end: a second launcher
    is refused, naming the first (two would run the same pairs at once). The lock is ``flock`` on
    ``<results_dir>/.suite/lock``, which the kernel releases when its holder dies, ``kill -9``
    included, so no lock is ever stale; the file is removed at the end, with the folders made for it
    if they stay empty (whoever locks a file checks it is still the one at that path)."""
    made = _make_folders(results_dir / JOBS_FOLDER)
    path = results_dir / JOBS_FOLDER / LOCK
    while True:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(descriptor, 4096).decode(errors="replace").strip() or "a suite that is starting"
            os.close(descriptor)
            raise RuntimeError(f"{results_dir} is in use by another suite ({holder}; the lock is {path}): two would run "
                               "the same pairs at once. Let it finish (or stop it), then start this one again: it "
                               "skips the pairs the other finished") from None
        locked = os.fstat(descriptor)
        if path.exists() and (path.stat().st_dev, path.stat().st_ino) == (locked.st_dev, locked.st_ino):
            break
        os.close(descriptor)  # its holder ended and removed it between our open and our lock
    try:
        started = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
        os.write(descriptor, f"pid {os.getpid()} on {socket.gethostname()}, started {started}, suite file "
                             f"{suite_file}".encode())
        yield
    finally:
        path.unlink()
        os.close(descriptor)
        _remove_empty(made)


def _safe_name(label: str) -> str:
    """A job's label as a file's or a SLURM job's name: nothing but letters, digits and ``_ . + -``."""
    return re.sub(r"[^A-Za-z0-9_.+-]+", "-", label)


def _file_name(job: Job) -> str:
    return f"job{job.number}-{_safe_name(job.label)}"


def launch(console: Console, jobs: list[Job], results_dir: Path, launcher: str = "local", devices: int = 1,
           resources: SlurmResources | None = None) -> list[Outcome]:
    """Run the jobs as ``launcher`` says (``devices``: how many at once on this machine); every pair's
    outcome, in the jobs' order. A summary line at the end."""
    if launcher == "slurm":
        alone = [job.label for job in jobs if not job.worker]
        if alone:
            raise ValueError(f"--launcher slurm runs each job as one task; {', '.join(alone)} asks for several devices "
                             "or nodes: run it on its own with srun (docs/large-runs.md), or give it trainer.devices: 1")
        if resources is None:
            raise ValueError("--launcher slurm: the suite file has no slurm: block; give it at least the time a job "
                             "may run, e.g. slurm: {partition: gpu, gpus_per_task: 1, time: \"4:00:00\"}")
    started = time.monotonic()
    concurrent = launcher == "slurm" or devices > 1
    if concurrent:  # the longest first; one that starts processes of its own alone, after the others
        ordered = [jobs[i] for i in longest_first([job.estimate for job in jobs])]
        ordered = [job for job in ordered if job.worker] + [job for job in ordered if not job.worker]
    else:
        ordered = list(jobs)
    slots = [Slot({}, None, "")] * len(jobs) if launcher == "slurm" else device_slots(devices)
    with tempfile.TemporaryDirectory(prefix="xbench-suite-") as scratch:
        # a folder of logs under results_dir, but not before the launcher shows it can start, nor
        # left behind if no job starts
        folder = (results_dir / JOBS_FOLDER / datetime.now().strftime("%Y%m%d-%H%M%S-%f")).resolve() if concurrent \
            else Path(scratch)
        executor = submitit_executor(folder, resources) if launcher == "slurm" else None
        folder.mkdir(parents=True, exist_ok=True)
        tracked = []
        try:
            for job in ordered:
                name = _file_name(job)
                request = {"cwd": os.getcwd(), "outcomes": str(folder / f"{name}.jsonl"), "jobs": job.tasks}
                if executor is not None:
                    watchdog = {"launcher_alive": str(folder / LAUNCHER_ALIVE), "watchdog_seconds": WATCHDOG_SECONDS}
                    run = SubmititRun(job, {**request, **watchdog}, executor)
                else:
                    (folder / f"{name}.json").write_text(json.dumps(request))
                    run = LocalRun(job, folder / f"{name}.json", folder / f"{name}.log" if concurrent else None,
                                   results_dir)
                tracked.append(Tracked(job, run, folder / f"{name}.jsonl" if job.worker else None))
            progress = Launch(console, len(jobs), quiet_pairs=not concurrent,
                              alive=folder / LAUNCHER_ALIVE if executor is not None else None)
            outcomes = progress.run(tracked, slots, len(slots))
        except BaseException:
            if concurrent and not any(entry.run.started for entry in tracked):
                shutil.rmtree(folder, ignore_errors=True)
            raise
    where = f"; logs in {folder}" if concurrent else ""
    console.print(f"Jobs: {progress.finished} finished, {progress.failed} failed, in "
                  f"{_duration(time.monotonic() - started)}{where}", highlight=False)
    rank = {id(pair): i for i, job in enumerate(jobs) for pair in job.pairs}
    return sorted(outcomes, key=lambda outcome: rank[id(outcome[0])])
