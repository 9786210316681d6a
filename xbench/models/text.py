"""Text towers and tokenizers from local folders only.

Every model that embeds prompts reads its tokenizer and BERT from a folder the user placed under
``checkpoints/``; nothing is looked up on a hub (``local_files_only`` everywhere, and
``HF_HUB_OFFLINE`` is set when ``xbench`` is imported).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor
from transformers import AutoTokenizer, BertConfig, BertModel, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from xbench.cache import cache_root, check_cache_writable
from xbench.files import atomic_write, present
from xbench.models.checkpoints import check_safetensors, require_finite
from xbench.models.hub import missing_files_fix

#: Keys a BERT checkpoint may carry beyond ``BertModel``: its pre-training heads and the
#: ``position_ids`` buffer that transformers < 4.31 saved.
BERT_EXTRA_KEYS = ("cls.", "embeddings.position_ids", "bert.embeddings.position_ids")


def require_files(folder: str | Path, names: tuple[str, ...], what: str) -> Path:
    """``folder`` if it holds every file in ``names``; else an error listing what is missing."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(f"{what}: folder {folder} not found. {missing_files_fix(folder, names)}")
    missing = tuple(name for name in names if not present(folder / name))
    if missing:
        raise FileNotFoundError(
            f"{what}: {', '.join(missing)} not found in {folder}. {missing_files_fix(folder, missing)}")
    return folder


def load_tokenizer(folder: str | Path, what: str, **kwargs) -> PreTrainedTokenizerBase:
    """The tokenizer saved in ``folder`` (needs at least ``vocab.txt`` for WordPiece models);
    ``kwargs`` override its saved settings (e.g. ``do_lower_case``)."""
    folder = require_files(folder, ("vocab.txt",), what)
    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True, **kwargs)


def bert_from_config(folder: str | Path, what: str, **config_overrides) -> BertModel:
    """An untrained ``BertModel`` shaped by ``folder/config.json``; its weights come from the model's checkpoint."""
    folder = require_files(folder, ("config.json",), what)
    config = BertConfig.from_pretrained(str(folder), local_files_only=True, **config_overrides)
    return BertModel(config)


def load_pretrained(model_class, folder: str | Path, what: str, extra_keys: tuple[str, ...] = (), **kwargs):
    """``model_class.from_pretrained(folder)`` offline, in float32 and eval mode, checked against its
    loading report: no weight may be missing or reshaped, and a weight of the file the model does not
    hold may only start or end with one of ``extra_keys``. Anything else is an error naming the keys.
    A damaged ``.safetensors`` file is named before transformers reads it, a config transformers
    refuses is named with its reason, and a NaN or inf in the weights is named by its tensor."""
    folder = Path(folder)
    for path in sorted(folder.glob("*.safetensors")):
        check_safetensors(path)
    verbosity, progress_bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()  # its load report would list the keys dropped on purpose; we check below
    hf_logging.disable_progress_bar()  # a "Loading weights" bar per model: noise a user cannot act on
    try:
        # reshaped weights come back in the report (to be named below) instead of a bare error
        model, info = model_class.from_pretrained(str(folder), local_files_only=True, output_loading_info=True,
                                                  ignore_mismatched_sizes=True, **kwargs)
    except Exception as error:  # noqa: BLE001 -- a config of the wrong type or range fails in many error types
        reason = " ".join(str(error).split())
        raise ValueError(f"{what}: transformers cannot load {model_class.__name__} from {folder} "
                         f"({type(error).__name__}: {reason}); check its config.json against the checkpoint's own, "
                         "or fetch the checkpoint again") from error
    finally:
        hf_logging.set_verbosity(verbosity)
        if progress_bar:
            hf_logging.enable_progress_bar()
    unexpected = [key for key in info["unexpected_keys"]
                  if not (key.startswith(extra_keys) or key.endswith(extra_keys))] if extra_keys else list(
        info["unexpected_keys"])
    problems = []
    if info["missing_keys"]:
        problems.append(f"missing weights: {sorted(info['missing_keys'])}")
    if unexpected:
        problems.append(f"unexpected weights: {sorted(unexpected)}")
    if info.get("mismatched_keys"):
        problems.append(f"reshaped weights: {info['mismatched_keys']}")
    if problems:
        raise ValueError(f"{what}: the weights in {folder} do not match its config.json: " + "; ".join(problems))
    require_finite(model.state_dict(), f"{what}: the weights in {folder}")
    return model.float().eval()


def load_pretrained_bert(folder: str | Path, what: str, **kwargs) -> BertModel:
    """A ``BertModel`` with the weights in ``folder``, checked against its loading report
    (`load_pretrained`): unexpected keys may only be the pre-training heads and the old
    ``position_ids`` buffer (`BERT_EXTRA_KEYS`)."""
    folder = require_files(folder, ("config.json",), what)
    return load_pretrained(BertModel, folder, what, BERT_EXTRA_KEYS, **kwargs)


#: The files of a BERT folder that decide its outputs: weights (either format), shape, vocabulary.
BERT_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
BERT_TOKENIZER_FILES = ("config.json", "vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
#: Bump when the recipe below changes, so old cache entries are not reused (2: the authors' ``[CLS]``
#: + pieces without ``[SEP]``; 1 tokenised with the standard ``[CLS] ... [SEP]``).
CLS_EMBEDDING_RECIPE = "cls-last-hidden/2"
TEXTS_PER_BATCH = 64


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def cls_only_tokens(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], max_length: int) -> dict[str, Tensor]:
    """``input_ids`` and ``attention_mask`` [N, max_length]: ``[CLS]`` + at most ``max_length - 1``
    word pieces, then padding. MedKLIP's and MAVL's tokenizer overrides BERT's special tokens this
    way for a single text (no ``[SEP]``); the standard call would add ``[SEP]`` and keep one piece less."""
    pieces = tokenizer(list(texts), add_special_tokens=False, truncation=True, max_length=max_length - 1)["input_ids"]
    ids = torch.full((len(pieces), max_length), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros(len(pieces), max_length, dtype=torch.long)
    for row, text_ids in enumerate(pieces):
        ids[row, : len(text_ids) + 1] = torch.tensor([tokenizer.cls_token_id, *text_ids])
        mask[row, : len(text_ids) + 1] = 1
    return {"input_ids": ids, "attention_mask": mask}


def bert_cls_embeddings(
    folder: str | Path,
    texts: Sequence[str],
    what: str,
    *,
    max_length: int = 64,
    lowercase: bool = True,
) -> Tensor:
    """The ``[CLS]`` last hidden state of each text under the BERT in ``folder``: float32 [N, hidden].

    The recipe of MedKLIP-style query books, as the authors' ``models/tokenization_bert.py`` (the
    same file in MedKLIP and MAVL) builds a single text: ``[CLS]`` and the WordPiece tokens
    (lower-cased if ``lowercase``), no ``[SEP]``, cut to ``max_length - 1`` pieces and padded to
    ``max_length`` (`cls_only_tokens`); ``input_ids`` and ``attention_mask`` through the BERT in
    eval mode under ``no_grad``, on the CPU (once per cache entry; the values do not depend on the
    device of the run that first needed them). The BERT is loaded by `load_pretrained_bert`, so its
    loading report is checked. The result is cached in ``$XBENCH_CACHE/text_embeddings/`` under a
    SHA-256 of the folder's weight and tokenizer files, the texts and these settings: a second run
    with the same files and texts reads the cache and never builds the BERT.
    """
    folder = require_files(folder, ("config.json", "vocab.txt"), what)
    weights = [folder / name for name in BERT_WEIGHT_FILES if present(folder / name)]
    if not weights:
        raise FileNotFoundError(
            f"{what}: no weights in {folder} (expected one of {', '.join(BERT_WEIGHT_FILES)}). "
            "Place the files listed in checkpoints/README.md there."
        )
    key = hashlib.sha256()
    for path in [*weights, *(folder / name for name in BERT_TOKENIZER_FILES if present(folder / name))]:
        key.update(f"{path.name}:{_file_digest(path)}\n".encode())
    key.update(json.dumps([CLS_EMBEDDING_RECIPE, max_length, lowercase, list(texts)]).encode())
    cache_file = cache_root() / "text_embeddings" / f"{key.hexdigest()}.safetensors"
    if present(cache_file):
        return load_file(str(cache_file))["embeddings"]
    check_cache_writable()  # before the BERT runs, not after

    tokenizer = load_tokenizer(folder, what, do_lower_case=lowercase)
    bert = load_pretrained_bert(folder, what)
    chunks = []
    with torch.no_grad():
        for start in range(0, len(texts), TEXTS_PER_BATCH):
            tokens = cls_only_tokens(tokenizer, texts[start:start + TEXTS_PER_BATCH], max_length)
            output = bert(input_ids=tokens["input_ids"], attention_mask=tokens["attention_mask"])
            chunks.append(output.last_hidden_state[:, 0].float())
    embeddings = torch.cat(chunks).contiguous()
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    # atomic: parallel processes write the same bytes
    atomic_write(cache_file, lambda path: save_file({"embeddings": embeddings}, str(path)))
    return embeddings


class PromptPairs:
    """The text side of a model that scores a finding by a positive and a negative prompt (CLIP,
    BiomedCLIP, CheXzero, BioViL): templates with one ``{}`` for the finding's text, or for a report
    phrase in phrase grounding; ``forward`` reads ``pos_text`` and ``neg_text`` [N, D]. The model
    implements ``embed_text(prompts) -> [N, D]`` on its own device."""

    pos_template: str
    neg_template: str

    def set_templates(self, pos_template: str, neg_template: str) -> None:
        for template in (pos_template, neg_template):
            if template.count("{}") != 1:
                raise ValueError(f"a prompt template needs exactly one '{{}}' for the finding; got {template!r}")
        self.pos_template, self.neg_template = pos_template, neg_template

    def prompt_pair(self, text: str) -> tuple[str, str]:
        """The positive and negative prompt of a finding's text or a report phrase."""
        return self.pos_template.format(text), self.neg_template.format(text)

    def embed_pairs(self, pairs: list[tuple[str, str]]) -> dict[str, Tensor]:
        """What ``forward`` reads for N prompt pairs: ``pos_text`` and ``neg_text`` [N, D]."""
        positive, negative = zip(*pairs)
        return {"pos_text": self.embed_text(list(positive)), "neg_text": self.embed_text(list(negative))}

    def encode_phrases(self, phrases: list[str]) -> dict[str, Tensor]:
        """Each phrase in the prompt pair, as a finding's text is; the map is its positive prompt's
        (the negative keeps the pair's logit, which Grad-CAM differentiates, defined)."""
        return self.embed_pairs([self.prompt_pair(phrase) for phrase in phrases])
