"""XBench: zero-shot recognition and grounding of chest X-ray vision-language models."""

import os
from importlib.metadata import version

# No code path may reach the network: weights and tokenizers come from local folders only.
# huggingface_hub and transformers read these when first imported.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
# albumentations asks the network for a newer release on import unless this is set.
os.environ["NO_ALBUMENTATIONS_UPDATE"] = "1"

__version__ = version("xbench")
