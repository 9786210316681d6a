"""CARZero's forward time per image, at full size with random weights.

    python bench/carzero.py [--device cuda] [--batch 8] [--classes 10] [--repeats 5] [--threads N]

Writes a random CARZero in the authors' layout (a 0.9 GB ``CARZero_best_model.ckpt`` and the
BioClinicalMPBERT ``config.json``/``vocab.txt`` geometry) to a temporary folder, builds the model
through its public API as a run does, and times ``forward`` on a batch of 224x224 images for the
first ``--classes`` ChestX-Det10 findings (the figure in docs/performance.md: 10 classes, batch 8). Prints the
best-of-``--repeats`` time per image of the whole forward and, timed alone, of its two parts: the
ViT, and both cross-attention passes with the placing of the maps in the frame.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from xbench.findings import PAPER_CLASSES
from xbench.models.carzero import GRID, CARZero
from xbench.models.random_weights import write_carzero
from xbench.geometry.maps import place_in_frame
from timing import best_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="CPU threads for torch")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    classes = list(PAPER_CLASSES["chestx_det10"][: args.classes])
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        write_carzero(Path(folder), classes)
        written = time.perf_counter() - start
        start = time.perf_counter()
        model = CARZero(checkpoint_dir=folder)
        model.build(classes)
        built = time.perf_counter() - start
    model = model.to(device).eval()
    native = torch.rand(256, 208, generator=torch.Generator().manual_seed(0)).numpy()
    inputs, window = (t.to(device) for t in model.preprocess(native, 224))
    inputs, windows = inputs.expand(args.batch, -1, -1, -1), window.expand(args.batch, 4)
    with torch.no_grad():
        image_global, patches = model.network.img_encoder(inputs)

        def align_and_place():
            _, attention = model.network.align(image_global, patches, model.sentences, model.words)
            return place_in_frame(attention.unflatten(-1, (GRID, GRID)), windows, (224, 224), model.map_upsample)

        total = best_seconds(lambda: model(inputs), device, args.repeats)
        vit = best_seconds(lambda: model.network.img_encoder(inputs), device, args.repeats)
        fusion = best_seconds(align_and_place, device, args.repeats)
    per_image = 1e3 / args.batch
    print(f"device {device}, batch {args.batch}, {len(classes)} classes, {torch.get_num_threads()} CPU threads")
    print(f"random checkpoint written in {written:.1f} s; build (load + prompts) {built:.1f} s")
    print(f"forward: {total * per_image:.0f} ms per image ({total:.2f} s per batch, best of {args.repeats})")
    print(f"  ViT-B/16 alone: {vit * per_image:.0f} ms per image ({vit / total:.0%} of the forward)")
    print(f"  both alignment passes + frame placement alone: {fusion * per_image:.0f} ms per image "
          f"({fusion / total:.0%})")


if __name__ == "__main__":
    main()
