"""The suite's launchers: submitit (its local executor runs SLURM's path without sbatch) and
``--devices N`` write what a serial run writes; a job that dies loses only its own pairs; a re-run
skips what finished; Ctrl-C cancels what was started; the sbatch script states the suite file's
resources, as the plan prints them; jobs that run at once start longest first; a job dies with its
launcher, which holds its results folder till then; Ctrl-C ends a worker on one line; a launcher that
ignores SIGINT (a script's background job) still cancels its jobs."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import yaml

from conftest import CONFIGS, results_contents
from test_suite_modes import PHANTOM, ROTATED, TWO_CLASSES, outcomes
from xbench import costs, launch
from xbench.launch import Job, Launch, Tracked, cpu_shares, device_slots, parse_slurm, submitit_executor
from xbench.suite import Pair, jobs, load_suite, main, plan, run_arguments
from xbench.suite_worker import ImagesDone
from xbench.test import main as xbench_test

REPO = Path(__file__).resolve().parents[1]
RANDOM = str(CONFIGS / "models" / "random.yaml")

USER_MODELS = '''
import json
import os
import signal
import time
from pathlib import Path

import torch

from xbench.models.baselines import RandomSaliency


class Killed(RandomSaliency):
    """Random maps; on two classes it kills its own process, where the suite's environment says so."""

    def infer(self, batch):
        if len(self.classes) == 2 and os.environ.get("XBENCH_TEST_KILL") == "1":
            os.kill(os.getpid(), signal.SIGKILL)
        return super().infer(batch)


class Sleeps(RandomSaliency):
    """Notes its process's id, then sleeps ten minutes: a job that would outlive whatever stops it."""

    def infer(self, batch):
        Path("job.pid").write_text(str(os.getpid()))
        time.sleep(600)
        return super().infer(batch)


class Pinned(RandomSaliency):
    """Random maps; notes the CPU cores, torch threads and GPUs its process was given."""

    def infer(self, batch):
        if not hasattr(self, "noted"):
            self.noted = True
            with Path("pinned.jsonl").open("a") as log:
                log.write(json.dumps({"cores": sorted(os.sched_getaffinity(0)), "threads": torch.get_num_threads(),
                                      "gpus": os.environ.get("CUDA_VISIBLE_DEVICES")}) + "\\n")
        return super().infer(batch)
'''

#: A SLURM block as a paper suite would state it (the local executor takes its time only).
SLURM = {"partition": "gpu", "gpus_per_task": 1, "cpus_per_task": 8, "mem": "64G", "time": "2:30:00",
         "sbatch": {"account": "mylab", "qos": "normal", "exclusive": True}}


@pytest.fixture
def user_models(tmp_path, monkeypatch) -> Path:
    """``launcher_models`` importable here and, through the environment the jobs are given, in them."""
    (tmp_path / "launcher_models.py").write_text(textwrap.dedent(USER_MODELS))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{REPO}")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write_suite(folder: Path, phantom_root: Path, models: list[str], datasets: list, **more) -> None:
    """``suite.yaml`` in ``folder``, made the current one; a model without ``/`` is in launcher_models."""
    folder.mkdir(parents=True, exist_ok=True)
    os.chdir(folder)
    entries = []
    for model in models:
        if "/" not in model:
            Path(f"{model.lower()}.yaml").write_text(yaml.safe_dump({"model": {"class_path": f"launcher_models.{model}"}}))
            model = f"{model.lower()}.yaml"
        entries.append(model)
    suite = {
        "results_dir": "results",
        "settings": {"data.image_size": 32, "data.batch_size": 4, "data.num_workers": 0, "data.root": str(phantom_root),
                     "trainer.enable_progress_bar": False, "trainer.logger": False},
        "models": entries, "datasets": datasets, **more,
    }
    Path("suite.yaml").write_text(yaml.safe_dump(suite, sort_keys=False))


def serial_run(folder: Path, phantom_root: Path, models: list[str], datasets: list, pairs: int | None = None) -> dict:
    """Each pair (the first ``pairs``) run by ``xbench.test`` in this process, one after another: the reference."""
    write_suite(folder, phantom_root, models, datasets)
    suite = load_suite(Path("suite.yaml"))
    for pair in plan(suite)[:pairs]:
        xbench_test(run_arguments(suite, pair))
    return results_contents(folder / "results")


def job_lines(out: str) -> list[str]:
    return [line.strip() for line in out.splitlines() if line.strip().startswith("[job ")]


@pytest.mark.slow  # submitit's jobs: processes of their own
def test_submitit_jobs_write_what_a_serial_run_writes_a_dead_job_loses_only_its_pairs(
        user_models, phantom_root, monkeypatch, capsys):
    monkeypatch.setattr(launch, "CLUSTER", "local")
    models, datasets = [RANDOM, "Killed"], [PHANTOM, TWO_CLASSES, ROTATED]
    serial = serial_run(user_models / "serial", phantom_root, models, datasets, pairs=4)  # what the jobs finish

    write_suite(user_models / "submitit", phantom_root, models, datasets, slurm=SLURM)
    monkeypatch.setenv("XBENCH_TEST_KILL", "1")  # reaches the jobs with the rest of the environment
    assert main(["--config", "suite.yaml", "--launcher", "slurm"]) == 1
    out = capsys.readouterr().out
    rows = outcomes(out)
    assert [row[:3] for row in rows] == [
        ("random", "phantom", "ok"), ("random", "phantom", "ok"), ("random", "phantom+rotate10", "ok"),
        ("killed", "phantom", "ok"), ("killed", "phantom", "failed"), ("killed", "phantom+rotate10", "not run")]
    logs = list((user_models / "submitit" / "results" / ".suite").glob("*/*_log.out"))
    assert len(logs) == 2
    died, later = rows[4][3], rows[5][3]
    assert "while running it; log: " in died and "before it; log: " in later
    log = Path(died.split("; log: ")[1])
    assert log in logs and "[4/6] killed on phantom" in log.read_text()  # the job's own output
    lines = job_lines(out)
    assert "[job 1/2] random: queued (3 pair(s))" in lines and "[job 1/2] random: running phantom (1 of 3)" in lines
    assert "[job 1/2] random: phantom ok, 9 images" in lines and "[job 1/2] random: finished, 3 of 3 pair(s) ok" in lines
    assert any(line.startswith("[job 2/2] killed: submitted as job ") for line in lines)
    assert any(line.startswith("[job 2/2] killed: failed, 1 of 3 pair(s) ok: its job ") and line.endswith(str(log))
               for line in lines), "\n".join(lines)
    assert "Jobs: 1 finished, 1 failed" in out
    launched = results_contents(user_models / "submitit" / "results")
    assert launched.keys() == serial.keys() and len(serial) == 4
    for key, files in launched.items():
        assert files.keys() == serial[key].keys() and len(files) >= 6
        for name in files:
            assert files[name] == serial[key][name], (key, name)

    # a re-run skips the four pairs that finished, and runs the other two
    assert main(["--config", "suite.yaml", "--launcher", "slurm", "--dry-run"]) == 0
    assert "2 of 6 pairs to run, per-model, SLURM" in capsys.readouterr().out
    assert [(p.status, p.dataset.label) for p in plan(load_suite(Path("suite.yaml")))] == [
        ("done", "phantom"), ("done", "phantom"), ("done", "phantom+rotate10"),
        ("done", "phantom"), ("run", "phantom"), ("run", "phantom+rotate10")]


@pytest.mark.slow  # two jobs' processes at once
def test_devices_2_runs_two_pinned_jobs_at_once_and_writes_what_a_serial_run_writes(
        user_models, phantom_root, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip(f"--devices 2 on a CPU needs two cores to share; this process may use {len(cores)}")
    serial = serial_run(user_models / "serial", phantom_root, ["Pinned"], [PHANTOM, TWO_CLASSES])

    write_suite(user_models / "devices", phantom_root, ["Pinned"], [PHANTOM, TWO_CLASSES], mode="per-pair")
    assert main(["--config", "suite.yaml", "--devices", "2"]) == 0
    lines = job_lines(capsys.readouterr().out)
    first, second = cpu_shares(2, cores)
    started = [lines.index(f"[job {n}/2] pinned on phantom: started on CPU cores {launch._ranges(share)}")
               for n, share in ((1, first), (2, second))]
    assert max(started) < min(i for i, line in enumerate(lines) if ": finished" in line)  # both ran at once
    noted = [json.loads(line) for line in Path("pinned.jsonl").read_text().splitlines()]
    assert sorted((note["cores"], note["threads"]) for note in noted) == [(first, len(first)), (second, len(second))]
    launched = results_contents(user_models / "devices" / "results")
    assert launched.keys() == serial.keys() and len(serial) == 2
    for key, files in launched.items():
        assert files == serial[key], key


@pytest.fixture(params=["default", "ignored"])
def launcher_sigint(request):
    """The launcher's SIGINT as in a terminal, or ignored as a background job of a shell without job
    control inherits it (a script's ``&``, a CI runner's): either way its jobs hear a cancel, as they
    set SIGINT rather than inherit it -- inherited, a local job would end only by the SIGKILL 10 s
    later and submitit's local job would run its pair to the end. Set here, whatever pytest itself
    was started with."""
    handler = signal.default_int_handler if request.param == "default" else signal.SIG_IGN
    previous = signal.signal(signal.SIGINT, handler)
    yield request.param
    signal.signal(signal.SIGINT, previous)


@pytest.mark.slow  # jobs' processes, cancelled
@pytest.mark.parametrize("options", [["--launcher", "slurm"], ["--devices", "2"]])
def test_ctrl_c_cancels_every_job_started(user_models, phantom_root, monkeypatch, capsys, options, launcher_sigint):
    monkeypatch.setattr(launch, "CLUSTER", "local")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("--devices 2 on a CPU needs two cores to share")
    cancelled = []
    for run in (launch.LocalRun, launch.SubmititRun):
        def cancel(self, cancel=run.cancel):
            cancelled.append(self)
            cancel(self)
        monkeypatch.setattr(run, "cancel", cancel)

    def interrupt(self, tracked):
        raise KeyboardInterrupt

    monkeypatch.setattr(Launch, "read", interrupt)  # Ctrl-C once both jobs are started
    write_suite(user_models, phantom_root, [RANDOM], [PHANTOM, TWO_CLASSES], mode="per-pair", slurm=SLURM)
    with pytest.raises(KeyboardInterrupt):
        main(["--config", "suite.yaml", *options])
    out = capsys.readouterr().out
    assert len(cancelled) == 2 and "Interrupted: 2 job(s) cancelled, 0 not started" in out
    for run in cancelled:
        process = run.process if isinstance(run, launch.LocalRun) else run.handle._process
        assert process.wait(timeout=60) is not None
        if isinstance(run, launch.SubmititRun):  # its controller ended on the cancel's SIGINT, not on its pair's end
            assert process.returncode == -signal.SIGINT
    assert not list((user_models / "results").glob("*/metrics.json"))


def sbatch_options(script: str) -> dict[str, str]:
    options = {}
    for line in script.splitlines():
        if line.startswith("#SBATCH --"):
            key, _, value = line.removeprefix("#SBATCH --").partition("=")
            options[key] = value or True
    return options


def test_the_sbatch_script_states_the_suite_files_resources(tmp_path, monkeypatch):
    """submitit writes the script without submitting it; ``srun`` need only be on PATH."""
    bin_folder = tmp_path / "bin"
    bin_folder.mkdir()
    (bin_folder / "srun").write_text("#!/bin/sh\nexit 1\n")
    (bin_folder / "srun").chmod(stat.S_IRWXU)
    monkeypatch.setenv("PATH", f"{bin_folder}:{os.environ['PATH']}")
    paper = yaml.safe_load((CONFIGS / "suites" / "paper.yaml").read_text())
    (tmp_path / "paper.yaml").write_text(yaml.safe_dump({**paper, "slurm": SLURM}))
    resources = load_suite(tmp_path / "paper.yaml").slurm
    executor = submitit_executor(tmp_path / "logs", resources)
    executor.update_parameters(name="xbench-medklip")  # as each job is submitted
    slurm = executor._executor  # the SlurmExecutor: its script is what sbatch gets
    script = slurm._make_submission_file_text(slurm._submitit_command_str, "uid")
    options = sbatch_options(script)
    assert {key: options[key] for key in ("partition", "gpus-per-task", "cpus-per-task", "mem", "time", "account",
                                          "qos", "exclusive", "job-name", "nodes", "ntasks-per-node")} == {
        "partition": "gpu", "gpus-per-task": "1", "cpus-per-task": "8", "mem": "64G", "time": "150",
        "account": "mylab", "qos": "normal", "exclusive": True, "job-name": "xbench-medklip", "nodes": "1",
        "ntasks-per-node": "1"}
    assert options["output"].startswith(str(tmp_path / "logs")) and "error" not in options  # one log per job
    assert options["export"] == "ALL"  # the job gets the submitting environment
    assert "-m submitit.core._submit" in script.splitlines()[-1] and "srun" in script.splitlines()[-1]


def test_the_plan_prints_sbatch_flags_as_the_script_has_them(tmp_path, monkeypatch, capsys):
    """Issue 41.2: the plan printed ``--exclusive=True`` where the script has ``--exclusive``."""
    bin_folder = tmp_path / "bin"
    bin_folder.mkdir()
    (bin_folder / "srun").write_text("#!/bin/sh\nexit 1\n")
    (bin_folder / "srun").chmod(stat.S_IRWXU)
    monkeypatch.setenv("PATH", f"{bin_folder}:{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    block = {**SLURM, "sbatch": {**SLURM["sbatch"], "constraint": "a100&nvlink", "mail_user": "me@lab.org"}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({"models": [RANDOM], "datasets": [PHANTOM], "slurm": block}))
    assert main(["--config", "s.yaml", "--launcher", "slurm", "--dry-run"]) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("Each SLURM job: ")]
    printed = [part for part in line.split(", ") if part.startswith("--")]
    assert sorted(printed) == ["--account=mylab", "--constraint='a100&nvlink'", "--exclusive",
                               "--mail-user=me@lab.org", "--qos=normal"]
    slurm = submitit_executor(tmp_path / "logs", load_suite(tmp_path / "s.yaml").slurm)._executor
    script = slurm._make_submission_file_text(slurm._submitit_command_str, "uid").splitlines()
    assert all(f"#SBATCH {flag}" in script for flag in printed)


@pytest.mark.parametrize("block, message", [
    ({"partition": "gpu"}, r"slurm.time is missing"),
    ({"time": "4h"}, r"slurm.time is how long one job may run.*got '4h'"),
    ({"time": 60, "gpus": 1}, r"slurm: unknown keys \['gpus'\]"),
    ({"time": 60, "gpus_per_task": -1}, r"slurm.gpus_per_task must be a whole number, at least 0; got -1"),
    ({"time": 60, "cpus_per_task": True}, r"slurm.cpus_per_task must be a whole number, at least 1; got True"),
    ({"time": 60, "mem": "64 GB"}, r"slurm.mem is the memory of a job as SLURM writes it.*got '64 GB'"),
    ({"time": 60, "partition": ""}, r"slurm.partition must be a partition's name"),
    ({"time": 60, "sbatch": {"job-name": "x"}}, r"slurm.sbatch: job-name is --job-name, an option XBench sets"),
    ({"time": 60, "sbatch": {"cpus_per_task": 4}}, r"slurm.sbatch: cpus_per_task is --cpus-per-task, an option XBench"),
    ({"time": 60, "sbatch": {"--account": "x"}}, r"slurm.sbatch: '--account' is not an sbatch option's long name"),
    ({"time": 60, "sbatch": {"account": None}}, r"slurm.sbatch.account must be an account's name .*, a number, or true"),
    ([60], r"slurm must be a mapping"),
])
def test_a_bad_slurm_block_is_a_named_error(tmp_path, block, message):
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({"models": ["m.yaml"], "datasets": ["d.yaml"], "slurm": block}))
    with pytest.raises(ValueError, match=rf"s.yaml: {message}"):
        load_suite(tmp_path / "s.yaml")


def test_slurm_times_and_memory_as_slurm_writes_them():
    assert parse_slurm({"time": "1-12:00:00", "mem": 16000}, "s").minutes == 36 * 60
    assert parse_slurm({"time": "0:00:30"}, "s").minutes == 1 and parse_slurm({"time": 90}, "s").minutes == 90
    assert parse_slurm({"time": 5, "mem": 16000}, "s").mem == "16000"


def test_slurm_refuses_a_pair_that_starts_processes_of_its_own(tmp_path):
    job = Job(1, "clip on rsna", [object()], [{"number": 1, "total": 1, "name": "clip on rsna", "args": []}],
              ["clip on rsna"], worker=False)
    with pytest.raises(ValueError, match="clip on rsna asks for several devices or nodes"):
        launch.launch(None, [job], tmp_path, "slurm", 1, parse_slurm({"time": 5}, "s"))
    with pytest.raises(ValueError, match="the suite file has no slurm: block"):
        launch.launch(None, [], tmp_path, "slurm", 1, None)


def test_devices_are_for_the_local_launcher(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--config", str(tmp_path / "s.yaml"), "--launcher", "slurm", "--devices", "2"])
    assert "--devices is for --launcher local" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--config", str(tmp_path / "s.yaml"), "--devices", "0"])
    assert "--devices is how many jobs run at once, at least 1; got 0" in capsys.readouterr().err


def test_jobs_that_run_at_once_start_longest_first():
    suite = load_suite(CONFIGS / "suites" / "extended.yaml")
    found = jobs(suite, [Pair(model, dataset) for model in suite.models for dataset in suite.datasets], "per-model")
    assert [job.label for job in found] == [model.label for model in suite.models]
    # a paper model's job: the images of the paper's datasets at its rate (MS-CXR's size is not recorded)
    images = sum(costs.SPLIT_IMAGES.values())
    for job in found[:7]:
        assert job.estimate == pytest.approx(images / costs.IMAGES_PER_SECOND[job.label])
    # chexzero, biovil, biovil_t, gloria, the transformers dual encoders and radzero: not recorded
    assert [job.estimate for job in found[7:]] == [None] * (len(suite.models) - 7)
    order = [found[i].label for i in costs.longest_first([job.estimate for job in found])]
    # those not recorded first, in the suite's order; then the slowest rate first
    assert order == [m.label for m in suite.models[7:]] + sorted(costs.IMAGES_PER_SECOND, key=costs.IMAGES_PER_SECOND.get)
    assert costs.longest_first([3.0, None, 5.0, None, 1.0]) == [1, 3, 2, 0, 4]
    # per pair, a pair's own dataset counts
    (pair,) = jobs(suite, [Pair(suite.models[0], suite.datasets[0])], "per-pair")
    assert pair.estimate == pytest.approx(costs.SPLIT_IMAGES["rsna"] / costs.IMAGES_PER_SECOND["clip"])


def test_devices_are_gpus_where_shown_else_shares_of_the_cpu_cores(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    assert [slot.env for slot in device_slots(2)] == [{"CUDA_VISIBLE_DEVICES": "2"}, {"CUDA_VISIBLE_DEVICES": "5"}]
    with pytest.raises(ValueError, match=r"--devices 3: this machine shows 2 GPU\(s\) \(2, 5\)"):
        device_slots(3)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert [slot.name for slot in device_slots(4)] == ["GPU 0", "GPU 1", "GPU 2", "GPU 3"]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 4, 5, 6, 7})
    slots = device_slots(3)
    assert [sorted(slot.cores) for slot in slots] == [[0, 1], [2, 4], [5, 6, 7]]
    assert [slot.env["OMP_NUM_THREADS"] for slot in slots] == ["2", "2", "3"]
    assert [slot.name for slot in slots] == ["CPU cores 0-1", "CPU cores 2,4", "CPU cores 5-7"]
    with pytest.raises(ValueError, match="--devices 8: no GPU here, and 7 CPU core"):
        device_slots(8)
    assert device_slots(1)[0].cores is None  # one job at a time: not pinned, as before


def test_progress_lines_follow_a_job_out_of_sight(tmp_path, monkeypatch, capsys):
    """The worker notes images done as batches end; the suite prints them for a job it cannot see."""
    monkeypatch.setattr("xbench.suite_worker.PROGRESS_SECONDS", 0.0)
    noted = []
    counter = ImagesDone(noted.append)
    for size in (4, 4, 1):
        counter.on_test_batch_end(None, None, None, {"index": torch.arange(size)}, 0)
    assert noted == [4, 8, 9]

    monkeypatch.setattr(launch, "PROGRESS_LINE_SECONDS", 0.0)
    path = tmp_path / "job.jsonl"
    tasks = [{"number": n, "total": 5, "name": f"m on d{n}", "args": []} for n in (4, 5)]
    tracked = Tracked(Job(2, "m", [None, None], tasks, ["d4", "d5"]), None, path)
    records = [{"number": 4, "state": "started"}, {"number": 4, "state": "progress", "images": 1200},
               {"number": 4, "state": "ok", "images": 1300}, {"number": 5, "state": "started"}]
    path.write_text("".join(json.dumps({"detail": "", **record}) + "\n" for record in records) + '{"number": 5, "st')
    from rich.console import Console
    Launch(Console(width=200), 3, quiet_pairs=False).read(tracked)
    assert job_lines(capsys.readouterr().out) == [
        "[job 2/3] m: running d4 (1 of 2)", "[job 2/3] m: running d4 (1 of 2), 1,200 images done",
        "[job 2/3] m: d4 ok, 1,300 images", "[job 2/3] m: running d5 (2 of 2)"]
    assert tracked.states == {4: ("ok", ""), 5: ("started", "")}  # the unfinished line waits for its end


# -- a job's lifetime: the processes themselves (issue 41) ---------------------------------------

#: How long a test waits for what a process does at its own pace (its imports take ~10 s on a
#: loaded machine): a safety net, not a budget.
SAFETY_NET_SECONDS = 300


def wait_for(condition, what: str, seconds: float = SAFETY_NET_SECONDS) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {seconds} s"
        time.sleep(0.1)


def gone(pid: int) -> bool:
    """The process has ended (a zombie has ended too: it waits only for a parent to read its status)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] in "ZX"
    except FileNotFoundError:
        return True


#: How a test starts a suite with ``--launcher slurm`` as a process of its own: submitit's local
#: executor, a watchdog that gives up on the suite after 3 s.
SLURM_SUITE = ("from xbench import launch; launch.CLUSTER = 'local'; launch.WATCHDOG_SECONDS = 3.0; "
               "from xbench.suite import main; main(['--config', 'suite.yaml', '--launcher', 'slurm'])")


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["local", "slurm"])
def test_a_job_dies_with_its_launcher_and_holds_its_results_folder_till_then(user_models, phantom_root, launcher):
    """Issue 41.2: ``kill -9`` of the suite left its job running its pairs unsupervised, and a second
    suite ran the same pairs at once. The job sleeps ten minutes. A local one gets SIGKILL from the
    kernel as its launcher dies (Linux's PR_SET_PDEATHSIG): gone at once. A SLURM one (submitit's
    local executor here) ends itself once it has not seen its launcher for WATCHDOG_SECONDS (3 s
    here), looking every 0.3 s. The wait is only a safety net."""
    if launcher == "local" and not sys.platform.startswith("linux"):
        pytest.skip("the parent-death signal is Linux's")
    write_suite(user_models, phantom_root, ["Sleeps"], [PHANTOM], slurm=SLURM)
    command = ["-m", "xbench.suite", "--config", "suite.yaml"] if launcher == "local" else ["-c", SLURM_SUITE]
    suite = subprocess.Popen([sys.executable, *command], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(Path("job.pid").exists, "the job to start its pair")
        job = int(Path("job.pid").read_text())
        with pytest.raises(RuntimeError, match=rf"results is in use by another suite \(pid {suite.pid} on "):
            main(["--config", "suite.yaml"])
    finally:
        suite.kill()
        suite.wait()
    wait_for(lambda: gone(job), "the job to die with its launcher", seconds=60)
    with launch.results_lock(Path("results"), Path("next.yaml")):  # released by the kernel with its holder
        pass


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["while it imports", "while it runs a pair"])
def test_ctrl_c_ends_a_worker_on_one_line(user_models, phantom_root, moment, launcher_sigint):
    """Issue 41.2: SIGINT during a worker's imports printed a KeyboardInterrupt traceback. Started as
    the launcher starts it, SIGINT to its session (as a cancel sends it) ends it with one line.
    Issue 48.5: also from a launcher that ignores SIGINT, which the worker ignored too (and slept on);
    during a pair, before the SIGKILL a launcher sends ``CANCEL_SECONDS`` after its cancel."""
    write_suite(user_models, phantom_root, ["Sleeps"], [PHANTOM])
    suite = load_suite(Path("suite.yaml"))
    (job,) = jobs(suite, plan(suite), "per-model")
    request = {"cwd": os.getcwd(), "outcomes": str(user_models / "job.jsonl"), "jobs": job.tasks}
    (user_models / "job.json").write_text(json.dumps(request))
    run = launch.LocalRun(job, user_models / "job.json", user_models / "job.log", Path("results"))
    run.start(launch.Slot({}, None, ""))
    if moment == "while it runs a pair":
        wait_for(Path("job.pid").exists, "the worker to run its pair")
    os.killpg(run.process.pid, signal.SIGINT)
    cancelled = time.monotonic()
    wait_for(lambda: run.process.poll() is not None, "the worker to end")
    if moment == "while it runs a pair":
        assert time.monotonic() - cancelled < launch.CANCEL_SECONDS
    log = run.log.read_text()
    assert run.process.returncode == 130 and "Traceback" not in log, log
    assert [line for line in log.splitlines() if "interrupted" in line] == ["xbench-suite-worker: interrupted"], log
