"""Text towers and tokenizers from local folders only.

Every model that embeds prompts reads its tokenizer and BERT from a folder the user placed under
``checkpoints/``; nothing is looked up on a hub (``local_files_only`` everywhere, and
``HF_HUB_OFFLINE`` is set when ``xbench`` is imported).
"""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer, BertConfig, BertModel, PreTrainedTokenizerBase

#: Keys a BERT checkpoint may carry beyond ``BertModel``: its pre-training heads and the
#: ``position_ids`` buffer that transformers < 4.31 saved.
BERT_EXTRA_KEYS = ("cls.", "embeddings.position_ids", "bert.embeddings.position_ids")


def require_files(folder: str | Path, names: tuple[str, ...], what: str) -> Path:
    """``folder`` if it holds every file in ``names``; else an error listing what is missing."""
    folder = Path(folder).expanduser()
    hint = "Place the files listed in checkpoints/README.md there."
    if not folder.is_dir():
        raise FileNotFoundError(f"{what}: folder {folder} not found. {hint}")
    missing = [name for name in names if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{what}: {', '.join(missing)} not found in {folder}. {hint}")
    return folder


def load_tokenizer(folder: str | Path, what: str) -> PreTrainedTokenizerBase:
    """The tokenizer saved in ``folder`` (needs at least ``vocab.txt`` for WordPiece models)."""
    folder = require_files(folder, ("vocab.txt",), what)
    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def bert_from_config(folder: str | Path, what: str, **config_overrides) -> BertModel:
    """An untrained ``BertModel`` shaped by ``folder/config.json``; its weights come from the model's checkpoint."""
    folder = require_files(folder, ("config.json",), what)
    config = BertConfig.from_pretrained(str(folder), local_files_only=True, **config_overrides)
    return BertModel(config)


def load_pretrained_bert(folder: str | Path, what: str, **kwargs) -> BertModel:
    """A ``BertModel`` with the weights in ``folder``, checked against its loading report.

    No weight may be missing; unexpected keys may only be the pre-training heads and the old
    ``position_ids`` buffer (:data:`BERT_EXTRA_KEYS`). Anything else is an error naming the keys.
    """
    folder = require_files(folder, ("config.json",), what)
    model, info = BertModel.from_pretrained(str(folder), local_files_only=True, output_loading_info=True, **kwargs)
    unexpected = [key for key in info["unexpected_keys"] if not key.startswith(BERT_EXTRA_KEYS)]
    problems = []
    if info["missing_keys"]:
        problems.append(f"missing weights: {sorted(info['missing_keys'])}")
    if unexpected:
        problems.append(f"unexpected weights: {sorted(unexpected)}")
    if info.get("mismatched_keys"):
        problems.append(f"reshaped weights: {info['mismatched_keys']}")
    if problems:
        raise ValueError(f"{what}: the BERT weights in {folder} do not match its config.json: " + "; ".join(problems))
    return model.eval()
