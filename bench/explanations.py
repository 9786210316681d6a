"""What the sanity, faithfulness and robustness checks cost per checked image, as a multiple of the
plain run's cost per image, each model at full size with random weights (``bench/throughput.py``'s
builders).

    python bench/explanations.py [--device cuda] [--models clip medklip ...] [--images 4] [--checked 2]
                                 [--threads N] [--native 512]

Data: ``--images`` phantom images (ChestX-Det10's layout and classes) through the real loader at 224;
the checks look at ``--checked`` of them. Per model, side by side in one process:

- **forward**: the model's forward on its own input of one batch of all the images (as the run makes
  it), per image, best of three -- a plain run's cost per image, less a few percent of harness
  (``bench/throughput.py``);
- each **setting** (the sanity cascade; faithfulness with K deletion/insertion steps and P ROAD
  percentiles; robustness with S noisy copies of each kind): ``trainer.test`` with the check added,
  against the same run without it (after a first run that loaded the weights); its cost per checked
  image is the extra wall time over the checked images, and the ratio is that over the forward per
  image.

Each pair costs faithfulness 2 (K + 1) + 2 P forwards and 2 P noisy linear imputations (a sparse
solve over the input's pixels, on the CPU); each image costs the sanity check one forward per cascade
step (``len(cascade_steps)``, printed) and a text re-encoding for each step of a text group; each
image costs robustness 2 S + 1 forwards with maps (S uniform and S Gaussian copies, and the input),
linear in S: the default S = 200 costs 20 times S = 10.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import shutil
import tempfile
import time
import warnings
from datetime import date
from pathlib import Path

import lightning as L
import torch

from throughput import BUILDERS
from timing import synchronize
from xbench.checks.faithfulness import Faithfulness
from xbench.checks.robustness import Robustness
from xbench.checks.sanity import Sanity, cascade_steps
from xbench.data.phantom import Phantom, generate_phantom
from xbench.findings import PAPER_CLASSES

#: (label, the check) -- the settings whose cost is measured; ``checked`` images each.
SETTINGS = {
    "sanity cascade": lambda n: Sanity(images=n),
    "faithfulness K=20, P=9 (defaults)": lambda n: Faithfulness(images=n),
    "faithfulness K=10, P=9": lambda n: Faithfulness(images=n, steps=10),
    "faithfulness K=10, P=3": lambda n: Faithfulness(images=n, steps=10, road_percentiles=[10, 50, 90]),
    "robustness S=10": lambda n: Robustness(images=n, samples=10),
    "robustness S=200 (defaults)": lambda n: Robustness(images=n),
}
#: The sections the settings write, for their pair counts.
SECTIONS = ("sanity", "faithfulness", "robustness")


def timed_run(model, datamodule, device: torch.device, callbacks: list) -> float:
    """Wall seconds of one ``trainer.test`` (logger and results folder off)."""
    trainer = L.Trainer(accelerator=device.type, devices=[device.index or 0] if device.type == "cuda" else 1,
                        use_distributed_sampler=False, logger=False, callbacks=callbacks, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False)
    start = time.perf_counter()
    trainer.test(model, datamodule=datamodule, verbose=False)
    synchronize(device)
    return time.perf_counter() - start


@torch.inference_mode()
def forward_per_image(model, datamodule, device: torch.device) -> float:
    """Seconds per image of the model's forward on one batch of its own input, best of three."""
    batch = next(iter(datamodule.test_dataloader()))
    inputs = (batch["image"] if model.preprocess is None else batch["model_input"]).to(device)
    model.to(device).eval()
    best = float("inf")
    for _ in range(3):
        synchronize(device)
        start = time.perf_counter()
        model(inputs)
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best / len(inputs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--models", nargs="+", default=["clip", "medklip"],
                        choices=[m for m in BUILDERS if m not in ("random", "centre_prior")])
    parser.add_argument("--images", type=int, default=4, help="images in the split")
    parser.add_argument("--checked", type=int, default=2, help="images the checks look at")
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="CPU threads for torch")
    parser.add_argument("--native", type=int, default=512, help="side of the phantom's PNGs")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    device = torch.device(args.device)
    scratch = Path(tempfile.mkdtemp(prefix="xbench-explanations-"))
    os.environ["XBENCH_CACHE"] = str(scratch / "cache")
    try:
        classes = list(PAPER_CLASSES["chestx_det10"])
        datamodule = Phantom(num_images=args.images, native_size=args.native, classes=classes, batch_size=args.images,
                             num_workers=0)
        generate_phantom(datamodule.root, args.images, args.native, datamodule.seed)
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{os.cpu_count()} cores"
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        print(f"{date.today()}  {platform.node()}, device {device} ({name}), {torch.get_num_threads()} torch threads, "
              f"load average {load:.2f}; {args.images} phantom images of {args.native}x{args.native} -> 224, "
              f"{len(classes)} classes, the checks on {args.checked} of them")
        for model_name in args.models:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # DeViDe's provisional layout
                model = BUILDERS[model_name](scratch / "weights", classes)
                timed_run(model, datamodule, device, [])  # the weights and the text side, loaded once
                run = timed_run(model, datamodule, device, [])
                plain = forward_per_image(model, datamodule, device)
                steps = len(cascade_steps(model, model.layer_groups))
                print(f"  {model_name:<10} forward {plain:6.3f} s per image, a run without checks {run:6.1f} s; "
                      f"{steps} cascade steps", flush=True)
                for label in args.settings:
                    check = SETTINGS[label](args.checked)
                    extra = (timed_run(model, datamodule, device, [check]) - run) / args.checked
                    pairs = next((model.results[s]["pairs"] for s in SECTIONS if s in model.results), None)
                    print(f"    {label:<36} {extra:8.2f} s per checked image = {extra / plain:6.0f} x forward"
                          f"   ({pairs} pairs)", flush=True)
            shutil.rmtree(scratch / "weights", ignore_errors=True)
        if hasattr(os, "getloadavg"):
            print(f"load average at the end {os.getloadavg()[0]:.2f}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
