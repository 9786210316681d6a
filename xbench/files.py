"""Reading and writing files: errors that name the file, writes a reader never sees half done, and
the modes the user's umask gives.

Every file and folder XBench creates -- results, analyses, reports, the decoded-image cache, the
phantom, text embeddings -- goes through `atomic_write` or `staging_folder`, so a
group the user shares a folder with can read it as it could a file made by ``open``.
"""

from __future__ import annotations

import csv
import errno
import json
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import yaml


#: What a path that should hold a file holds instead, by its ``stat`` type.
NOT_A_FILE = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"),
              (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def regular_file(path: Path) -> Path:
    """``path``, checked to be a regular file before anything opens it: ``open`` on a named pipe
    waits for a writer for ever, and a device (``/dev/zero``) never ends. A missing path is the
    `FileNotFoundError` ``open`` raises; anything else but a file is a `ValueError` naming what it is."""
    mode = os.stat(path).st_mode  # a missing path: the FileNotFoundError ``open`` would raise
    if not stat.S_ISREG(mode):
        raise ValueError(f"{path} is {_kind(mode, 'not a regular file')}, not a file: name the file itself")
    return Path(path)


def _kind(mode: int, otherwise: str) -> str:
    """What a path of ``stat`` ``mode`` holds, in `NOT_A_FILE`'s words, else ``otherwise``."""
    return next((name for test, name in NOT_A_FILE if test(mode)), otherwise)


def present(path: Path) -> bool:
    """Whether a file is at ``path``, where one is looked for by name and may be absent (nothing
    there: ``False``); anything but a regular file there is an error naming it (`regular_file`), not
    taken for absent and so reported "not found"."""
    if not Path(path).exists():
        return False
    regular_file(path)
    return True


@contextmanager
def open_text(path: Path) -> Iterator[IO[str]]:
    """``path`` opened as UTF-8 text (a byte-order mark tolerated); bytes that are not UTF-8, or a
    line the csv module cannot read, are an error naming the file; anything but a regular file is
    refused before it is opened (`regular_file`)."""
    try:
        with open(regular_file(path), newline="", encoding="utf-8-sig") as handle:
            yield handle
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{path} is not UTF-8 text (byte {error.object[error.start:error.start + 1]!r} at offset {error.start} of "
            "the part read): is it the file as downloaded? Save it as UTF-8."
        ) from None
    except csv.Error as error:
        raise ValueError(f"{path}: not a readable CSV file ({error})") from None


#: The most bytes a reader takes in whole (`read_json`, `read_yaml`): the text and the objects made
#: of it are held at once, several times the file's size, so a larger file is refused before it is
#: read, naming its size and the cap, never a bare MemoryError. Settings -- configs, suite files,
#: manifests, ``metrics.json``, a model's settings -- are KBs to a few MB.
SETTINGS_CAP = 64 * 2**20
#: The cap for a dataset's annotation JSON: the largest released (cheXlocalize's segmentations)
#: are some hundreds of MB.
ANNOTATIONS_CAP = 2**30


def within_cap(path: Path, cap: int) -> Path:
    """``path``, a regular file (`regular_file`) of at most ``cap`` bytes; else an error naming its size."""
    size = regular_file(path).stat().st_size
    if size > cap:
        raise ValueError(f"{path} holds {size / 2**20:,.0f} MiB, more than the {cap / 2**20:,.0f} MiB XBench reads "
                         "from such a file: is it the right file? Name the file meant, or cut it down")
    return Path(path)


def read_json(path: Path, cap: int = SETTINGS_CAP):
    """The JSON in ``path`` (at most ``cap`` bytes, `within_cap`); an empty, truncated or non-UTF-8
    file is an error naming it and the place."""
    try:
        with open_text(within_cap(path, cap)) as handle:
            return json.load(handle)
    except json.JSONDecodeError as error:
        state = "is empty" if not Path(path).stat().st_size else f"is not valid JSON ({error})"
        raise ValueError(f"{path} {state}: was it truncated? Download or write it again.") from None


def read_json_object(path: Path, holds: str, fix: str) -> dict:
    """The JSON object in ``path``; anything else is an error naming the file, what it should hold
    (``holds``) and the ``fix``."""
    value = read_json(path)
    if not isinstance(value, dict):
        raise ValueError(f"{path} holds a JSON {type(value).__name__}, not {holds}; {fix}")
    return value


def read_yaml(path: Path):
    """The YAML in ``path`` (settings: at most `SETTINGS_CAP` bytes); a file that is not valid YAML is
    an error naming it and the line."""
    try:
        with open_text(within_cap(path, SETTINGS_CAP)) as handle:
            return yaml.safe_load(handle)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        place = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error)
        raise ValueError(f"{path}{place}: not valid YAML ({problem}); fix the file") from None


def current_umask() -> int:
    """The process's file-mode creation mask, read without changing it (``os.umask`` can only read
    it by setting it, a moment in which another thread's new file would get the wrong mode)."""
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1], 8) for line in status if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError):  # not Linux, or a kernel before 4.7
        mask = os.umask(0o022)
        os.umask(mask)
        return mask


def follow_umask(path: Path, folder: bool = False) -> None:
    """Give ``path`` the mode a plain ``open`` or ``mkdir`` would have: ``tempfile`` makes files
    0600 and folders 0700, unreadable to the group a user shares results with."""
    os.chmod(path, (0o777 if folder else 0o666) & ~current_umask())


def staging_folder(parent: Path, name: str) -> Path:
    """A new hidden folder ``.name.XXXX`` under ``parent`` (made if missing) with the mode ``mkdir``
    would give, in which a folder is built before it is renamed into place as ``name``."""
    Path(parent).mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=parent, prefix=f".{name}."))
    follow_umask(staging, folder=True)
    return staging


#: The errors of a folder the user may not write in: permissions, a read-only file system.
READ_ONLY = (errno.EACCES, errno.EPERM, errno.EROFS)


def check_writable_folder(folder: Path, named: str, fix: str) -> None:
    """Fail before the work, not after it: ``folder`` (given as ``named``, an option or a variable)
    must be a folder XBench can write in, or make: the nearest of it and its parents that exists
    must be a folder in which a file can be made (made and removed: nothing is left behind); else
    an error saying what is wrong (a file in the way, read-only) and the ``fix``."""
    folder = Path(folder)
    try:
        nearest = next(path for path in (folder, *folder.parents) if path.exists())
        if nearest.is_dir():
            tempfile.TemporaryFile(dir=nearest).close()
            return
        why = f"{nearest} is {_kind(os.stat(nearest).st_mode, 'a file')}"
    except OSError as error:
        why = f"read-only to this user: {error.strerror}" if error.errno in READ_ONLY else error.strerror or str(error)
    raise ValueError(f"{named} {folder} is not a folder XBench can write in ({why}); {fix}")


#: The errors of a write that found no room: a full disk, a quota, a file-size limit (``ulimit -f``).
NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class WriteFailed(OSError):
    """A write that failed (most often for want of room): the message names what was being written
    and the fix, where the system's error names neither ("[Errno 27] File too large")."""

    def __init__(self, error: OSError, target: str,
                 fix: str = "free space or lift the limit and run again") -> None:
        self.reason = getattr(error, "reason", error.strerror or str(error))
        self.target = target
        super().__init__(error.errno, f"{self.reason}: writing {target} failed (a full disk, a quota or a file-size "
                                      f"limit such as `ulimit -f`?); {fix}")


def atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """Call ``write`` on a temporary file beside ``path``, then rename it to ``path`` (with the mode
    the user's umask gives a new file).

    A reader never sees a half-written file: an interrupted write leaves the old file (or none). A
    failed write (a full disk, a file-size limit) is a [`WriteFailed`][xbench.files.WriteFailed]
    naming ``path``.
    """
    path = Path(path)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(descriptor)
    try:
        write(Path(temporary))
        follow_umask(Path(temporary))
        os.replace(temporary, path)
    except OSError as error:
        Path(temporary).unlink(missing_ok=True)
        if error.filename is not None or str(path) in str(error):
            raise
        raise WriteFailed(error, str(path)) from error
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
