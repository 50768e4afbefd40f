"""Peak memory and time of CoCoOp's per-image text passes, by chunk size (CPU).

CoCoOp encodes B x C prompts per batch; CoCoOpCLIP encodes TRAINER.COCOOP.TEXT_CHUNK_SIZE
(image, class) prompts at a time (and recomputes chunks in the backward pass when
training needs more than one). This script measures, for one evaluation batch (no
autograd) or with ``--train`` one training step, and for each chunk size, the extra
resident memory at the peak, the wall time and the CPU time, in a fresh process per
chunk size, and checks that the logits (evaluation) or the meta-net gradient (training)
do not change (largest difference relative to the largest value).

By default the text tower has ViT-B/16's width (512), heads (8) and context length (77)
but ``--text-layers`` blocks (default 2): without autograd only one block's activations
are alive at a time, so the peak does not depend on the depth, only the time does (x 6
for 12 layers); the image tower is a tiny ViT (its cost is negligible). ``--vit-b16``
uses the whole ViT-B/16 architecture instead (12 text layers, 224 px images), which a
training step needs: its activations are kept for every layer. Random weights.

Class names have 1 to 8 words (class c has c % 8 + 1), so every chunk holds a sentence
of the longest kind: the text tower computes positions 0..max(end-of-text) of a pass,
here 17 of the 77.

    python tools/benchmark_cocoop.py --classes 1000 --images 2 --chunks 0 1024 256
    python tools/benchmark_cocoop.py --vit-b16 --train --classes 1000 --images 1 --chunks 0 256
    (chunk 0 = all B x C prompts in one pass)
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmark import current_rss_mib  # noqa: E402  (tools/benchmark.py, beside this script)


def clip_config(text_layers):
    """open_clip config: ViT-B/16's text tower shape (with ``text_layers`` blocks), tiny ViT."""
    return {
        "embed_dim": 512,
        "quick_gelu": True,
        "vision_cfg": {"image_size": 32, "layers": 1, "width": 64, "patch_size": 16, "head_width": 16},
        "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 512, "heads": 8, "layers": text_layers},
    }


def class_names(count):
    """``count`` names of 1 to 8 words (see the module docstring)."""
    words = ["red", "small", "striped", "house", "sea", "mountain", "dog", "bird"]
    return [" ".join(words[: index % 8 + 1] + [str(index)]) for index in range(count)]


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def worker(args):
    """One measurement in this process; prints a JSON line."""
    from trainers.cocoop import CoCoOpCLIP
    from vlprompt.clip import CLIPRunner, Tokenizer, load_clip
    from vlprompt.config import extend_cfg, get_cfg_default

    torch.manual_seed(0)  # the same random ViT-B/16 weights in every worker
    model, _ = load_clip(args.config, args.weights)
    cfg = get_cfg_default()
    extend_cfg(cfg)
    node = cfg.TRAINER.COCOOP
    node.N_CTX, node.CTX_INIT = 4, "a photo of a"
    node.TEXT_CHUNK_SIZE = args.chunk or args.images * args.classes
    torch.manual_seed(0)
    cocoop = CoCoOpCLIP(CLIPRunner(model), Tokenizer(args.config), class_names(args.classes), node).eval()
    size = model.visual.image_size[0]
    images = torch.randn(args.images, 3, size, size, generator=torch.Generator().manual_seed(1))
    before = current_rss_mib()
    start, start_cpu = time.perf_counter(), time.process_time()
    if args.train:  # forward and backward of the training loss
        loss, logits, _ = cocoop.train().loss(images, torch.zeros(args.images, dtype=torch.long))
        loss.backward()
        logits = cocoop.prompt_learner.meta_net.linear1.weight.grad
    else:
        with torch.no_grad():
            logits = cocoop(images)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - start_cpu
    torch.save(logits, args.logits)
    positions = int(cocoop.prompt_learner.eot.max()) + 1
    print(json.dumps({"chunk": node.TEXT_CHUNK_SIZE, "extra_peak_mb": peak_rss_mb() - before, "seconds": seconds,
                      "cpu_seconds": cpu_seconds, "positions": positions}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--images", type=int, default=2)
    parser.add_argument("--chunks", type=int, nargs="+", default=[0, 1024, 256, 64])
    parser.add_argument("--text-layers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--train", action="store_true", help="measure a training step (forward + backward)")
    parser.add_argument("--vit-b16", action="store_true", help="the whole ViT-B/16 architecture (random weights)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--chunk", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--weights", help=argparse.SUPPRESS)
    parser.add_argument("--logits", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.worker:
        return worker(args)

    from vlprompt.testing import write_tiny_clip

    folder = tempfile.mkdtemp(prefix="benchmark_cocoop_")
    if args.vit_b16:
        config, weights, layers = "ViT-B/16", "random", 12
    else:
        config, weights = write_tiny_clip(folder, name="cocoop-bench", config=clip_config(args.text_layers))
        layers = args.text_layers
    what = "training step (forward + backward)" if args.train else "evaluation batch"
    print(f"CoCoOp {what}: {args.images} images x {args.classes} classes = "
          f"{args.images * args.classes} prompts; text tower width 512, context 77, {layers} layers; "
          f"{args.threads} threads")
    print(f"{'chunk':>8}  {'extra peak RSS (MB)':>20}  {'time (s)':>9}  {'CPU time (s)':>12}  "
          f"{'MB / prompt in flight':>22}  max |difference| / max |value|")
    reference = None
    for chunk in args.chunks:
        logits_path = os.path.join(folder, f"logits_{chunk}.pt")
        command = [sys.executable, __file__, "--worker", "--chunk", str(chunk), "--classes", str(args.classes),
                   "--images", str(args.images), "--threads", str(args.threads), "--config", config,
                   "--weights", weights, "--logits", logits_path] + (["--train"] if args.train else [])
        output = subprocess.run(command, check=True, capture_output=True, text=True, cwd=ROOT).stdout
        result = json.loads(output.strip().splitlines()[-1])
        logits = torch.load(logits_path, weights_only=True)
        reference = logits if reference is None else reference
        difference = float((logits - reference).abs().max() / reference.abs().max())
        in_flight = min(result["chunk"], args.images * args.classes)
        print(f"{result['chunk']:>8}  {result['extra_peak_mb']:>20.0f}  {result['seconds']:>9.1f}  "
              f"{result['cpu_seconds']:>12.1f}  {result['extra_peak_mb'] / in_flight:>22.3f}  {difference:.2e}")
    print(f"Text positions computed per pass: {result['positions']} of 77")


if __name__ == "__main__":
    main()
