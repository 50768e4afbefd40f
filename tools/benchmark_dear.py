"""Cost of a DeAR training step, with and without the self-regulariser L_reg.

Builds the ViT-B/16 architecture with random weights (no download; the cost does not
depend on the weight values) and DeAR with the paper's settings from
configs/trainers/DeAR/vit_b16_base2new.yaml (role map of configs/head_roles/vit_b16_openai.yaml,
J = 9, 5 attributes, 4 text tokens), then times on one batch:

* ``frozen``: a plain frozen CLIP image forward of the batch (no autograd);
* ``dear``: a DeAR training step (forward, loss, backward, AdamW step) with L_reg;
* ``dear_noreg``: the same step with LAMBDA_REG 0 (no frozen branch);
* ``reg_branch``: the frozen branch of L_reg alone: layers J..L of frozen CLIP continued
  from the prefix the prompted pass shares with it (layer J's input and its q, k, v).

The overhead of L_reg is ``dear / dear_noreg - 1``; ``reg_branch / dear_noreg`` measures its
main part directly (one call, so less noisy than a difference of two steps).

Measurements are interleaved round by round and the median is reported. On CUDA the
step runs under autocast (PREC amp) and images/s and peak memory are printed too. On a
CPU shared with other jobs wall-clock times are unreliable; ``--clock cpu`` times the
process's CPU time instead (all its threads).

    python tools/benchmark_dear.py                       # batch 16 at 224, 50 classes
    python tools/benchmark_dear.py --batch 4 --rounds 5 --clock cpu --flops  # a quicker CPU run
    python tools/benchmark_dear.py --config-file configs/trainers/DeAR/synthetic.yaml --image-size 32

``--config-file`` takes the backbone and TRAINER.DEAR from another trainer config (e.g.
the tiny synthetic CLIP); ``--weights`` defaults to random weights either way. Run it from
the repository root (role-map paths in the configs are relative to it).
"""
import argparse
import os
import statistics
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAPER_CONFIG = os.path.join(ROOT, "configs", "trainers", "DeAR", "vit_b16_base2new.yaml")
sys.path.insert(0, ROOT)

from trainers.dear import DeARCLIP, check_dear_config, deep_head_roles  # noqa: E402
from vlprompt.clip import CLIPRunner, Tokenizer, load_clip  # noqa: E402
from vlprompt.config import ConfigError, extend_cfg, get_cfg_default, merge_from_file  # noqa: E402
from vlprompt.engine.amp import MixedPrecision  # noqa: E402
from benchmark import clocks, peak_memory_mib, reset_peak_memory  # noqa: E402  (tools/benchmark.py)


def build_model(args, lambda_reg, device):
    cfg = get_cfg_default()
    extend_cfg(cfg)
    merge_from_file(cfg, args.config_file)
    node = cfg.TRAINER.DEAR
    node.LAMBDA_REG = lambda_reg
    node.MASK_STRATEGY = args.mask_strategy or node.MASK_STRATEGY
    check_dear_config(node)
    backbone = cfg.MODEL.BACKBONE.NAME
    model, _ = load_clip(backbone, args.weights, device=device)
    clip = CLIPRunner(model)
    roles = deep_head_roles(node, clip.visual.num_layers, clip.visual.num_heads)
    classnames = [f"class number {i}" for i in range(args.num_classes)]
    torch.manual_seed(0)
    dear = DeARCLIP(clip, Tokenizer(backbone), classnames, "a photo of a {}.", node, roles).to(device)
    optimizer = torch.optim.AdamW([p for p in dear.parameters() if p.requires_grad], lr=1e-3)
    return dear, optimizer, node.MASK_STRATEGY


def count_flops(cases):
    """Floating-point operations of one call of each case (matrix products; attention
    through the math kernel so that its products are counted too)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    flops = {}
    for name, fn in cases.items():
        with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
            fn()
        flops[name] = counter.get_total_flops()
    return flops


def main(args):
    """Measure and print; returns {"median": {case: seconds}, "flops": {case: FLOPs}}."""
    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    if args.threads:
        torch.set_num_threads(args.threads)
    amp = MixedPrecision(args.prec, device)
    images = torch.randn(args.batch, 3, args.image_size, args.image_size, device=device)
    labels = torch.randint(0, args.num_classes, (args.batch,), device=device)
    with_reg, optim_reg, masks = build_model(args, 1.0, device)
    without_reg, optim_noreg, _ = build_model(args, 0.0, device)

    def frozen():
        with torch.no_grad(), amp.autocast():
            with_reg.clip.visual(images)

    def step(model, optimizer):
        def run():
            optimizer.zero_grad()
            with amp.autocast():
                loss, _, _ = model.loss(images, labels)
            amp.backward(loss)
            amp.step([optimizer])
        return run

    with torch.no_grad(), amp.autocast():
        prefix = with_reg.clip.visual.shared_prefix(images, with_reg.vision_block)

    def reg_branch():
        with torch.no_grad(), amp.autocast():
            with_reg.clip.visual(prefix=prefix, rows=[0])

    cases = {"frozen": frozen, "dear": step(with_reg, optim_reg), "dear_noreg": step(without_reg, optim_noreg),
             "reg_branch": reg_branch}
    for fn in cases.values():  # first calls fill the caches (text prefix, frozen text features, masks)
        fn()
    flops = count_flops(cases) if args.flops else {}
    times = {name: [] for name in cases}
    which = 1 if args.clock == "cpu" else 0  # benchmark.clocks gives (wall, CPU)
    peak = {}
    for round_index in range(args.warmup + args.rounds):  # interleaved rounds
        for name, fn in cases.items():
            if device.type == "cuda":
                reset_peak_memory(device)
            start = clocks(device)[which]
            fn()
            if round_index >= args.warmup:
                times[name].append(clocks(device)[which] - start)
            if device.type == "cuda":
                peak[name] = peak_memory_mib(device)

    median = {name: statistics.median(values) for name, values in times.items()}
    print(f"device {device} ({torch.get_num_threads()} threads), precision {amp.prec}, batch {args.batch}, "
          f"image {args.image_size}, {args.num_classes} classes, masks {masks}, "
          f"{args.rounds} rounds after {args.warmup} warm-up, {args.clock} clock")
    for name in cases:
        spread = f"min {1000 * min(times[name]):.1f}, max {1000 * max(times[name]):.1f}"
        line = f"{name:<11} median {1000 * median[name]:9.1f} ms  ({spread})"
        if args.clock == "wall":
            line += f"  {args.batch / median[name]:8.1f} images/s"
        if name in peak:
            line += f"  peak memory {peak[name]:.0f} MiB"
        print(line)
    if flops:
        print(f"FLOPs per call: " + ", ".join(f"{name} {value / 1e9:.4g} G" for name, value in flops.items())
              + f"; L_reg adds {100 * (flops['dear'] / flops['dear_noreg'] - 1):.1f} % of the step's FLOPs")
    overhead = median["dear"] / median["dear_noreg"] - 1
    print(f"L_reg adds {100 * overhead:.1f} % to the training step "
          f"(target <= 15 %; the paper reports about 35 %); its frozen branch alone is "
          f"{100 * median['reg_branch'] / median['dear_noreg']:.1f} % of the step without it "
          f"and {median['reg_branch'] / median['frozen']:.2f}x a frozen CLIP forward")
    print(f"training step / frozen CLIP forward: with L_reg {median['dear'] / median['frozen']:.2f}x, "
          f"without {median['dear_noreg'] / median['frozen']:.2f}x")
    return {"median": median, "flops": flops}


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=224, help="input resolution (a multiple of 16)")
    parser.add_argument("--num-classes", type=int, default=50, help="classes whose text features are trained")
    parser.add_argument("--rounds", type=int, default=10, help="timed rounds")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    parser.add_argument("--prec", default="amp", help="TRAINER.DEAR.PREC (CUDA only; CPU runs fp32)")
    parser.add_argument("--config-file", default=PAPER_CONFIG,
                        help="a DeAR trainer config: its backbone and TRAINER.DEAR are used "
                             "(default: configs/trainers/DeAR/vit_b16_base2new.yaml, the paper's settings)")
    parser.add_argument("--weights", default="random", help="MODEL.BACKBONE.WEIGHTS (default: random weights)")
    parser.add_argument("--mask-strategy", help="TRAINER.DEAR.MASK_STRATEGY (default: the config's, role)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall-clock time, or the process's CPU time (for a shared CPU)")
    parser.add_argument("--flops", action="store_true", help="also count the FLOPs of each case (one extra call)")
    parser.add_argument("--cpu", action="store_true", help="stay on the CPU even if CUDA is available")
    return parser


if __name__ == "__main__":
    try:
        main(build_parser().parse_args())
    except ConfigError as error:
        sys.exit(f"benchmark_dear.py: {error}")
