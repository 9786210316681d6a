"""What each explainer (``--model.explainer``) costs per image, as a ratio of the model's native maps.

    python bench/explainers.py [--device cuda] [--models clip medklip ...] [--explainers gradcam scorecam ...]
                               [--classes 10] [--images 2] [--repeats 3] [--threads N]

Per model (random weights in the authors' file layout at full size, ``xbench.models.random_weights``,
built on the first ``--classes`` of ChestX-Det10's classes) and explainer: the wall time of
``model.explain`` -- what ``test_step`` calls -- on a batch of ``--images`` random inputs at the
model's input size, already on the device; the best of ``--repeats`` after a warm-up. The native
maps run in inference mode (a plain run's trainer), a CAM under ``no_grad`` with the layer's
gradients enabled (the trainer ``python -m xbench.test`` gives it). Printed: milliseconds per image
and the ratio to the native run of the same model, measured side by side.

What scales how: a gradient method (Grad-CAM, Grad-CAM++, HiResCAM, XGrad-CAM, LayerCAM) adds one
backward pass per class from the model's scores to its declared layer; EigenCAM an SVD of the layer
per image; Score-CAM a forward pass of the whole model per channel of the layer, per image and class
(CLIP ViT-B/16: 768 channels; MedKLIP's ResNet layer3: 1024), so it is left out unless asked for.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import shutil
import tempfile
import warnings
from datetime import date
from pathlib import Path

import numpy as np
import torch

from xbench.findings import PAPER_CLASSES
from xbench.models.explainers import CAM_METHODS, NATIVE
from throughput import BUILDERS, NETWORK_MODELS
from timing import best_seconds

#: Measured unless ``--explainers`` names others (Score-CAM: see the module's docstring).
DEFAULT_EXPLAINERS = [method for method in CAM_METHODS if method != "scorecam"]


def model_input(model, images: int, device: torch.device) -> torch.Tensor:
    """Random inputs of the shape the model's transform makes (CheXzero's letterbox of 320 is resized
    to 224); a model without one sees the frame, 224."""
    shape = (3, 224, 224)
    if model.preprocess is not None:
        ramp = np.arange(256, dtype=np.uint8)[None].repeat(256, 0)  # not constant: BioViL stretches it
        shape = tuple(model.preprocess(ramp, 224)[0].shape)
    return torch.rand(images, *shape, generator=torch.Generator().manual_seed(0)).to(device)


def seconds(model, inputs: torch.Tensor, explainer: str, device: torch.device, repeats: int) -> float:
    """Best wall time of one ``explain`` of ``inputs`` with ``explainer``, in the grad mode its run has."""
    model.explainer = explainer
    mode = torch.inference_mode if explainer == NATIVE else torch.no_grad
    with mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return best_seconds(lambda: model.explain(inputs), device, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--models", nargs="+", default=list(NETWORK_MODELS), choices=list(NETWORK_MODELS))
    parser.add_argument("--explainers", nargs="+", default=DEFAULT_EXPLAINERS, choices=list(CAM_METHODS))
    parser.add_argument("--classes", type=int, default=10, help="the first N of ChestX-Det10's classes")
    parser.add_argument("--images", type=int, default=2, help="images per batch")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls after a warm-up; the best counts")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="CPU threads for torch")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    device = torch.device(args.device)
    classes = list(PAPER_CLASSES["chestx_det10"])[: args.classes]
    scratch = Path(tempfile.mkdtemp(prefix="xbench-explainers-"))
    os.environ["XBENCH_CACHE"] = str(scratch / "cache")  # text embeddings
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{os.cpu_count()} cores"
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3]) if Path("/proc/loadavg").exists() else "n/a"
    print(f"{date.today()}  {platform.node()}, device {device} ({name}), {torch.get_num_threads()} torch threads, "
          f"load {load}; {len(classes)} classes, batches of {args.images} images, best of {args.repeats}")
    try:
        for model_name in args.models:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = BUILDERS[model_name](scratch / "weights", classes)
                model.build(classes)
            model.to(device).eval()
            inputs = model_input(model, args.images, device)
            native = seconds(model, inputs, NATIVE, device, args.repeats)
            print(f"  {model_name:<11} {'native':<10} {1e3 * native / args.images:10.1f} ms per image", flush=True)
            for explainer in args.explainers:
                spent = seconds(model, inputs, explainer, device, args.repeats)
                print(f"  {model_name:<11} {explainer:<10} {1e3 * spent / args.images:10.1f} ms per image "
                      f"{spent / native:8.1f}x native", flush=True)
            shutil.rmtree(scratch / "weights", ignore_errors=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
