"""Pretrain the tiny CLIP of the synthetic benchmark contrastively, on CPU.

    python tools/pretrain_tiny_clip.py --out weights/tiny-synthetic-clip.pt --seed 0

Renders image/caption pairs of the synthetic world on the fly (one worker process),
trains the open_clip model of ``--model-config`` from scratch with the multi-positive
contrastive loss (AdamW, linear warm-up then cosine), and writes

* ``OUT``: the weights in fp16 as an open_clip checkpoint ({"state_dict": ...}), loadable
  with ``vlprompt.clip.load_clip(model_config, OUT)`` like any local CLIP weights file;
* ``OUT`` with ``.txt`` instead of ``.pt``: the exact command, the seed, the settings,
  versions, wall time, steps per second, the final attribute probe and the checkpoint's
  SHA-256.

The data stream depends only on ``--seed`` (batch k comes from numpy's
``default_rng([seed, k])``); the weights also depend on torch's CPU kernels, so another
machine gives close but not bit-identical weights.
"""
import argparse
import hashlib
import math
import os
import platform
import resource
import shlex
import sys
import time

import torch

import open_clip

from vlprompt.clip.small_models import register_small_towers
from vlprompt.synthetic.pretraining import PairBatches, attribute_probe, multi_positive_loss
from vlprompt.fileio import atomic_write, write_text
from vlprompt.paths import repository_root

DEFAULT_CONFIG = "configs/clip/tiny-synthetic-clip.json"  # from the repository root
# Environment variables that change threading (recorded with the command; no effect on the data).
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS")


def from_root(path):
    """``path`` relative to the repository root when it lies inside it (as recorded in the notes)."""
    absolute = os.path.abspath(path)
    root = str(repository_root())
    return os.path.relpath(absolute, root) if absolute.startswith(root + os.sep) else path


def _children_cpu():
    """CPU seconds (user + system) of this process's finished child processes."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-config", default=str(repository_root() / DEFAULT_CONFIG),
                        help=f"open_clip model config JSON (default {DEFAULT_CONFIG})")
    parser.add_argument("--out", required=True, help="checkpoint to write (.pt)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the data stream and the initialisation")
    parser.add_argument("--steps", type=int, default=2000, help="optimisation steps")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--weight-decay", type=float, default=0.05)
    parser.add_argument("--warmup", type=float, default=0.03, help="fraction of the steps with linear warm-up")
    parser.add_argument("--workers", type=int, default=1, help="rendering worker processes")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the training process")
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--probe-every", type=int, default=400, help="steps between attribute probes (0: only at the end)")
    parser.add_argument("--probe-images", type=int, default=512, help="held-out images of the attribute probe")
    return parser


def learning_rate(step, args):
    """Linear warm-up over ``warmup * steps`` steps, then cosine decay to 0."""
    warmup = max(1, int(args.warmup * args.steps))
    if step < warmup:
        return args.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, args.steps - warmup)
    return args.lr * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_optimizer(model, args):
    """AdamW; no weight decay on gains, biases, embeddings of positions and the temperature."""
    decay, no_decay = [], []
    for name, parameter in model.named_parameters():
        plain = parameter.ndim < 2 or "positional_embedding" in name or "class_embedding" in name or name == "logit_scale"
        (no_decay if plain else decay).append(parameter)
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.98), eps=1e-6)


def format_probe(probe):
    return " ".join(f"{name} {100 * value:.1f}" for name, value in probe.items())


def main(argv=None):
    args = build_parser().parse_args(argv)
    environment = " ".join(f"{k}={os.environ[k]}" for k in THREAD_VARIABLES if k in os.environ)
    tool = os.path.relpath(repository_root() / "tools" / "pretrain_tiny_clip.py", os.getcwd())  # the command line, not this module
    command = " ".join(shlex.quote(a) for a in ["python", tool] + list(argv or sys.argv[1:]))
    command = f"{environment} {command}" if environment else command
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    register_small_towers()  # a model config may name the project's small timm towers
    open_clip.add_model_config(args.model_config)
    model_name = os.path.splitext(os.path.basename(args.model_config))[0]
    model = open_clip.create_model(model_name, pretrained=None)
    tokenizer = open_clip.get_tokenizer(model_name)
    optimizer = build_optimizer(model, args)
    print(f"{model_name}: {sum(p.numel() for p in model.parameters()):,} parameters; {args.steps} steps of {args.batch_size}")

    loader = torch.utils.data.DataLoader(
        PairBatches(args.seed, 0, args.steps, args.batch_size, tokenizer),
        batch_size=None, num_workers=args.workers, prefetch_factor=4 if args.workers else None,
    )
    start, load_start = time.time(), os.getloadavg()[0]
    cpu_start, children_start = time.process_time(), _children_cpu()
    running = None
    model.train()
    for step, batch in enumerate(loader):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args)
        image_features = model.encode_image(batch["images"], normalize=True)
        text_features = model.encode_text(batch["tokens"], normalize=True)
        loss = multi_positive_loss(image_features, text_features, batch["positives"], model.logit_scale.exp())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            model.logit_scale.clamp_(0, math.log(100))
        running = loss.item() if running is None else 0.95 * running + 0.05 * loss.item()
        if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            elapsed = time.time() - start
            print(f"step {step + 1}/{args.steps} loss {running:.4f} scale {model.logit_scale.exp().item():.1f} "
                  f"lr {learning_rate(step, args):.2e} {elapsed / 60:.1f} min ({(step + 1) / elapsed:.2f} steps/s)", flush=True)
        if args.probe_every and (step + 1) % args.probe_every == 0 and step + 1 < args.steps:
            model.eval()
            print(f"  probe: {format_probe(attribute_probe(model, tokenizer, args.seed + 1, args.probe_images))}", flush=True)
            model.train()
    wall = time.time() - start
    del loader  # its rendering workers exit, so that their CPU time is counted below
    cpu, children = time.process_time() - cpu_start, _children_cpu() - children_start
    load_end = os.getloadavg()[0]

    model.eval()
    probe = attribute_probe(model, tokenizer, args.seed + 1, args.probe_images)
    print(f"final probe: {format_probe(probe)}")
    state_dict = {key: value.half() for key, value in model.state_dict().items()}
    with atomic_write(args.out, "wb") as f:
        torch.save({"state_dict": state_dict}, f)
    with open(args.out, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    record = os.path.splitext(args.out)[0] + ".txt"
    write_text(
        f"{model_name}: a CLIP of the synthetic benchmark, pretrained by tools/pretrain_tiny_clip.py.\n\n"
        f"command: {command}\n"
        f"seed: {args.seed}\n"
        f"model config: {from_root(args.model_config)}\n"
        f"settings: steps {args.steps}, batch {args.batch_size}, AdamW lr {args.lr} betas (0.9, 0.98) "
        f"weight decay {args.weight_decay}, warm-up {args.warmup:.0%} then cosine, multi-positive contrastive loss\n"
        f"wall time: {wall / 60:.1f} min ({args.steps / wall:.2f} steps/s) with {args.threads} torch threads "
        f"and {args.workers} rendering worker(s) on {platform.processor() or platform.machine()} "
        f"({os.cpu_count()} logical CPUs), load average {load_start:.1f} at the start and {load_end:.1f} at the end\n"
        f"CPU time: {cpu / 60:.1f} min for the training process and {children / 60:.1f} min for the rendering "
        f"worker(s) ({(cpu + children) / args.steps:.2f} s per step; on {args.threads} otherwise idle cores about "
        f"{(cpu + children) / args.threads / 60:.0f} min of wall time)\n"
        f"versions: python {platform.python_version()}, torch {torch.__version__}, open_clip {open_clip.__version__}\n"
        f"final loss (running mean): {running:.4f}; logit scale {model.logit_scale.exp().item():.1f}\n"
        f"zero-shot attribute probe (pretraining style, held-out seed {args.seed + 1}): {format_probe(probe)}\n"
        f"checkpoint: {os.path.basename(args.out)} (fp16), sha256 {digest}\n",
        record,
    )
    print(f"Wrote {args.out} and {record} ({wall / 60:.1f} min)")


if __name__ == "__main__":
    main()
