"""Where every model's ``checkpoint_dir`` goes first: a folder, or a hub id
``hf-hub:<org>/<name>[@revision]`` (open_clip's prefix) found in the local Hugging Face cache by
huggingface_hub's own offline lookup, never asked of the network. Free of torch, so that the
suite's pre-check starts quickly."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import constants, snapshot_download
from huggingface_hub.errors import IncompleteSnapshotError, LocalEntryNotFoundError
from huggingface_hub.file_download import repo_folder_name
from huggingface_hub.utils import HFValidationError, validate_repo_id

from xbench.cli import InputError

#: open_clip's prefix for a Hugging Face Hub id, which XBench's checkpoint options take too.
HUB_PREFIX = "hf-hub:"
#: What a hub id looks like, for the messages that refuse one.
HUB_FORM = "hf-hub:<org>/<name>[@revision]"
#: A revision: a branch, a tag or a commit hash (a branch may hold ``/``, as ``refs/pr/1``).
REVISION = re.compile(r"[A-Za-z0-9_.\-]+(/[A-Za-z0-9_.\-]+)*")


@dataclass(frozen=True)
class HubId:
    """A Hugging Face Hub repository (``org/name``) at a revision (``None``: the hub's ``main``)."""

    repo: str
    revision: str | None = None

    def download_command(self, files: tuple[str, ...] = ()) -> str:
        """The command (huggingface_hub's ``hf`` CLI) that puts these files, or the whole repository, in the cache."""
        revision = f" --revision {self.revision}" if self.revision else ""
        return " ".join(("hf download", self.repo, *files)) + revision


def hub_id(value: str, option: str) -> HubId | None:
    """The hub id ``value`` names (``None`` for a plain path); a malformed one is an `InputError`
    naming ``option`` and the form."""
    if not value.startswith(HUB_PREFIX):
        return None
    repo, _, revision = value.removeprefix(HUB_PREFIX).partition("@")
    problem = None
    if repo.count("/") != 1:
        problem = "it needs exactly one / between the organisation and the name"
    elif "@" in value and not (REVISION.fullmatch(revision) and ".." not in revision.split("/")):
        problem = f"{revision!r} is not a branch, tag or commit hash"
    else:
        try:
            validate_repo_id(repo)
        except HFValidationError as error:
            problem = str(error).rstrip(".")
    if problem:
        raise InputError(f"{option} {value!r} is not a hub id: {problem}. Write {HUB_FORM}, e.g. "
                         "hf-hub:google/medsiglip-448, or a folder's path")
    return HubId(repo, revision or None)


def checkpoint_folder(value: str | Path, option: str = "--model.checkpoint_dir") -> Path:
    """The folder a checkpoint option names: a path as given (``~`` expanded), or a hub id's snapshot
    in the local Hugging Face cache (``HF_HUB_CACHE``, else ``HF_HOME/hub``), looked up by
    huggingface_hub with ``local_files_only``: no socket is opened. A snapshot not in the cache is
    named with the command that downloads it. A snapshot the cache knows to lack some of the
    repository's files (``hf download`` of a few files) is the folder all the same: the model's own
    check names the files it needs and is missing."""
    hub = hub_id(str(value), option)
    if hub is None:
        return Path(value).expanduser()
    try:
        return Path(snapshot_download(hub.repo, revision=hub.revision, local_files_only=True))
    except IncompleteSnapshotError as error:
        return Path(error.snapshot_path)
    except LocalEntryNotFoundError:
        cache = Path(constants.HF_HUB_CACHE)
        repo_folder = cache / repo_folder_name(repo_id=hub.repo, repo_type="model")
        held = f"holds {hub.repo} but not its revision {hub.revision or 'main'}" if repo_folder.is_dir() else (
            f"does not hold {hub.repo}")
        raise FileNotFoundError(f"{option} {value}: the Hugging Face cache {cache} {held}. Download it where a "
                                f"network is: {hub.download_command()} (or point HF_HUB_CACHE at the cache "
                                "that holds it)") from None


def snapshot_hub_id(folder: Path) -> tuple[HubId, Path] | None:
    """The hub id, pinned to its commit, of the Hugging Face cache's snapshot
    (``models--<org>--<name>/snapshots/<commit>``) that holds ``folder``, and where ``folder`` is in
    it; ``None`` for a folder outside the cache."""
    for snapshot in (folder, *folder.parents):
        repo_folder = snapshot.parent.parent
        if snapshot.parent.name == "snapshots" and repo_folder.name.startswith("models--"):
            repo = repo_folder.name.removeprefix("models--").replace("--", "/")  # a repo id never holds "--"
            return HubId(repo, snapshot.name), folder.relative_to(snapshot)
    return None


def missing_files_fix(folder: Path, names: tuple[str, ...]) -> str:
    """How to get the files ``names`` into ``folder``: a hub snapshot's download command, else the checkpoints guide."""
    found = snapshot_hub_id(folder)
    if found is None:
        return "Place the files listed in checkpoints/README.md there."
    hub, inside = found
    return f"Download them into the cache: {hub.download_command(tuple(str(inside / name) for name in names))}"
