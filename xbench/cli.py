"""How every XBench command ends: its output, or a short message on stderr and an exit status.

A failure prints ``<command>: error: <what went wrong>`` and exits 1; a usage error exits 2:
argparse's own, and an `InputError` a command raises for an input the user gave (a file named by an
option that cannot be used as it is), so that a CI job tells a bad input from a failed check. The
traceback is for developers, shown with ``XBENCH_DEBUG=1`` or ``--debug``. The third-party notices a
user cannot act on are silenced here, in the commands only: a script that imports XBench keeps its
warnings and its memory allocator's settings.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import warnings
from argparse import ArgumentError
from collections.abc import Callable

DEBUG_FLAG = "--debug"

#: (message regex, category) of warnings no XBench user can act on.
QUIET_WARNINGS = (
    (".*LeafSpec.*", FutureWarning),
    (".*anonymous.*", UserWarning),  # W&B's anonymous-setting deprecation
    (".*", DeprecationWarning),  # jsonargparse's and others' API deprecations
)
#: Loggers whose INFO lines are tips, not results (Lightning's litlogger advertisement, its devices,
#: "Seed set to 0": the seed is in the run's config).
QUIET_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero",
                 "lightning.fabric.utilities.seed")


class InputError(ValueError):
    """An input the user gave -- a file an option names, an option's value -- that cannot be used as
    it is: the command exits 2, like a usage error, never 1 (which a check that failed keeps)."""


#: Lines of jsonargparse's report that are its structure, not a reason.
STRUCTURE = ("Parser key", "Does not validate", "Subtypes:", "Errors:", "Given value", "- Problem with given class_path")


def invalid_value_message(error: BaseException) -> str:
    """The lines of a configuration error that say what is wrong. jsonargparse tries each subtype
    of ``model``/``data`` and reports every attempt (a ~70-line dump ending in "Expected a <class
    'NoneType'>"): kept are the reasons that are not about ``NoneType`` (XBench's own check, an
    unknown option, the type expected), the option a type error is about and the value given."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    reasons = [line.removeprefix("- ") for line in lines
               if not line.startswith(STRUCTURE) and "NoneType" not in line]
    if not reasons:
        return lines[0] if lines else type(error).__name__
    keys = [(n, line.split('"')[1]) for n, line in enumerate(lines) if line.startswith('Parser key "')]
    if len(keys) < 2 and (not keys or keys[0][1] in ("model", "data")):  # the reason says it all
        return "; ".join(reasons)
    position, key = keys[-1]
    given = next((line.removeprefix("Given value:").strip() for line in lines[position:]
                  if line.startswith("Given value:")), None)
    return f"option {key!r}: " + "; ".join(reasons) + (f" (given: {given})" if given is not None else "")


#: How torch's DataLoader re-raises a worker's exception: this line, then the worker's traceback.
WORKER_TRACEBACK = "Original Traceback (most recent call last):"


def without_worker_traceback(text: str) -> str:
    """A DataLoader worker's error, re-raised in the main process with the worker's traceback in its
    message, as the worker's own message: the lines after the traceback's last frame, less the type."""
    lines = text.split(WORKER_TRACEBACK, 1)[1].strip("\n").splitlines()
    last_frame = max((n for n, line in enumerate(lines) if line.startswith(" ")), default=-1)
    message = "\n".join(lines[last_frame + 1:]).strip()
    kind, separator, rest = message.partition(": ")
    return rest if separator and kind.replace(".", "").replace("_", "").isalnum() else message


def error_line(name: str, error: BaseException) -> str:
    """The one line a command prints for a failure."""
    text = str(error)
    message = without_worker_traceback(text) if WORKER_TRACEBACK in text else invalid_value_message(error)
    return f"{name}: error: {message} (XBENCH_DEBUG=1 or {DEBUG_FLAG}: the traceback)"


#: glibc's ``mallopt`` parameter number for the mmap threshold, and the value XBench fixes it at
#: (glibc's starting value).
M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES = -3, 128 * 1024


def return_large_frees_to_the_system() -> None:
    """Fix glibc's mmap threshold at 128 KiB, so every block of that size or more is its own mapping,
    given back to the system when freed. Left adaptive, the threshold rises to 32 MiB once a large
    tensor is freed; the batches' tensors then come from a heap that fragments and is never given
    back. Measured with ``bench/memory.py`` (15,000 images x 21 classes): the whole run's peak above
    the baseline went from 1.89 GB to 0.83 GB, the loop's from 1.38 GB to 0.15 GB, where the metric
    states hold 14 MB. DataLoader workers inherit it (fork). Nothing happens where libc has no
    ``mallopt`` (macOS); musl ignores it."""
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)


def quiet_notices() -> None:
    """Silence the third-party warnings and tips no XBench user can act on (a command's own
    process only: ``run`` below, a suite's job under submitit)."""
    for message, category in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    for logger in QUIET_LOGGERS:
        logging.getLogger(logger).setLevel(logging.WARNING)


def run(main: Callable[[], object], name: str) -> None:
    """Run a command's ``main`` and exit: 0, ``main``'s own status when it returns an int, 2 on a
    usage error or an `InputError` (also one a library re-raised as the cause of its own), 1 on any
    other error (message only, unless debugging), 130 when interrupted."""
    debug = os.environ.get("XBENCH_DEBUG") == "1" or DEBUG_FLAG in sys.argv
    if DEBUG_FLAG in sys.argv:
        sys.argv.remove(DEBUG_FLAG)
    if not debug:
        quiet_notices()
        warnings.formatwarning = lambda message, category, *_, **__: f"{name}: warning: {message}\n"
    return_large_frees_to_the_system()
    interrupts = []

    def interrupt(signum, frame) -> None:
        interrupts.append(signum)
        raise KeyboardInterrupt

    # not where SIGINT is ignored (a shell's background job: the shell's choice, kept; a suite's jobs
    # start with it at its default, xbench.launch._bound_to), nor off the main thread (no handler there)
    noted = signal.getsignal(signal.SIGINT) is signal.default_int_handler and \
        threading.current_thread() is threading.main_thread()
    if noted:
        signal.signal(signal.SIGINT, interrupt)
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # a suite's job starts with it held back
        status = main()
    except ArgumentError as error:  # a value of the wrong type, when the parser does not exit itself
        if debug:
            raise
        print(f"{name}: error: {invalid_value_message(error)}", file=sys.stderr)
        sys.exit(2)
    except InputError as error:
        if debug:
            raise
        print(error_line(name, error), file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        sys.exit(130)
    except SystemExit:
        if not interrupts:
            raise
        # Lightning's trainer ends a run it sees interrupted with sys.exit(1), without a word
        print(f"{name}: interrupted", file=sys.stderr)
        sys.exit(130)
    except MemoryError:  # the last resort, where no reader refused first what could not be held
        if debug:
            raise
        print(f"{name}: error: this machine ran out of memory: free memory (other programs, fewer jobs at once), "
              "read less at a time (a smaller --data.batch_size, fewer --data.num_workers) or run on a machine with "
              f"more (XBENCH_DEBUG=1 or {DEBUG_FLAG}: the traceback)", file=sys.stderr)
        sys.exit(1)
    except Exception as error:  # noqa: BLE001 -- every failure reaches the user as one message
        if debug:
            raise
        print(error_line(name, error), file=sys.stderr)
        # jsonargparse re-raises what a model's or a dataset's __init__ raised as a ValueError from it
        sys.exit(2 if isinstance(error.__cause__, InputError) else 1)
    finally:
        if noted:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(status if isinstance(status, int) else 0)
