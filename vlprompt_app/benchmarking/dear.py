"""``tools/benchmark.py dear``: cost of a DeAR training step with and without its regulariser L_reg.

Builds DeAR from a trainer config (default: the paper's settings,
configs/trainers/DeAR/vit_b16_base2new.yaml: ViT-B/16, role map of
configs/head_roles/vit_b16_openai.yaml, J = 9, 5 attributes, 4 text tokens) with random
weights (no download; the cost does not depend on the weight values), then times on one
batch, in interleaved rounds (median after ``--warmup`` untimed rounds; a first call of each
case fills the caches):

* ``frozen``: a plain frozen CLIP image forward of the batch (no autograd): the unit;
* ``dear``: a DeAR training step (forward, loss, backward, AdamW step) with L_reg;
* ``dear_noreg``: the same step with LAMBDA_REG 0 (no frozen branch);
* ``reg_branch``: the frozen branch of L_reg alone: layers J..L of frozen CLIP continued
  from the prefix the prompted pass shares with it (layer J's input and its q, k, v).

The overhead of L_reg is ``dear / dear_noreg - 1``; ``reg_branch / dear_noreg`` measures its
main part directly (one call, so less noisy than a difference of two steps). ``--flops``
also counts each case's FLOPs (machine-independent). On CUDA the step runs under autocast
(``--prec amp``) and the rows give images/s and peak memory. ``--config-file`` takes the
backbone and TRAINER.DEAR from another config (e.g. configs/trainers/DeAR/synthetic.yaml with
``--image-size 32``); role-map paths in the configs are relative to the repository root.
"""
from pathlib import Path

import torch

from vlprompt_app.benchmarking.flops import count_flops
from vlprompt_app.benchmarking.measure import medians, peak_memory_mib, reset_peak_memory, time_interleaved
from vlprompt.clip import CLIPRunner, Tokenizer, load_clip
from vlprompt.config import extend_cfg, get_cfg_default, merge_from_file
from vlprompt.engine.amp import MixedPrecision
from vlprompt.paths import repository_root
from vlprompt_app.project import import_project_package

PAPER_CONFIG = str(repository_root() / "configs" / "trainers" / "DeAR" / "vit_b16_base2new.yaml")
CASES = ("frozen", "dear", "dear_noreg", "reg_branch")


def from_root(path):
    """``path`` from the repository root when it is a relative path of a file there (the shipped
    configs name role maps and tiny CLIP files that way), else ``path`` unchanged."""
    if path and not Path(path).is_absolute() and (repository_root() / path).is_file():
        return str(repository_root() / path)
    return path


def build_model(settings, lambda_reg, device):
    """(DeARCLIP, AdamW over its learnable parameters, mask strategy) of ``settings``' config
    with TRAINER.DEAR.LAMBDA_REG = ``lambda_reg``; class names are "class number i"."""
    import_project_package("trainers")
    from trainers.dear import DeARCLIP, check_dear_config, deep_head_roles

    cfg = get_cfg_default()
    extend_cfg(cfg)
    merge_from_file(cfg, settings["config_file"])
    node = cfg.TRAINER.DEAR
    node.LAMBDA_REG = lambda_reg
    node.MASK_STRATEGY = settings["mask_strategy"] or node.MASK_STRATEGY
    node.ROLE_MAP = from_root(node.ROLE_MAP)
    check_dear_config(node, backbone=cfg.MODEL.BACKBONE)
    backbone = from_root(cfg.MODEL.BACKBONE.NAME)
    model, _ = load_clip(backbone, from_root(settings["weights"]), device=device)
    clip = CLIPRunner(model)
    roles = deep_head_roles(node, clip.visual.num_layers, clip.visual.num_heads, backbone=cfg.MODEL.BACKBONE)
    classnames = [f"class number {i}" for i in range(settings["classes"])]
    torch.manual_seed(0)
    dear = DeARCLIP(clip, Tokenizer(backbone), classnames, "a photo of a {}.", node, roles).to(device)
    optimizer = torch.optim.AdamW([p for p in dear.parameters() if p.requires_grad], lr=1e-3)
    return dear, optimizer, node.MASK_STRATEGY


def case_calls(settings, device):
    """{case: call} of the four cases (see the module docstring) and the mask strategy."""
    amp = MixedPrecision(settings["prec"], device)
    size = settings["image_size"]
    images = torch.randn(settings["batch"], 3, size, size, device=device)
    labels = torch.randint(0, settings["classes"], (settings["batch"],), device=device)
    with_reg, optim_reg, masks = build_model(settings, 1.0, device)
    without_reg, optim_noreg, _ = build_model(settings, 0.0, device)

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

    calls = {"frozen": frozen, "dear": step(with_reg, optim_reg), "dear_noreg": step(without_reg, optim_noreg),
             "reg_branch": reg_branch}
    return calls, masks, amp.prec


def add_arguments(parser):
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=224, help="input resolution (a multiple of the patch size)")
    parser.add_argument("--classes", type=int, default=50, help="classes whose text features are trained")
    parser.add_argument("--rounds", type=int, default=10, help="timed rounds")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    parser.add_argument("--prec", default="amp", help="TRAINER.DEAR.PREC (CUDA only; the CPU runs fp32)")
    parser.add_argument("--config-file", default=PAPER_CONFIG,
                        help="a DeAR trainer config: its backbone and TRAINER.DEAR are used "
                             "(default: configs/trainers/DeAR/vit_b16_base2new.yaml, the paper's settings)")
    parser.add_argument("--weights", default="random", help="MODEL.BACKBONE.WEIGHTS (default: random weights)")
    parser.add_argument("--mask-strategy", help="TRAINER.DEAR.MASK_STRATEGY (default: the config's)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--flops", action="store_true", help="also count the FLOPs of each case (one extra call)")
    parser.add_argument("--device", choices=("cpu", "cuda"),
                        help="default: cuda when available, else cpu")


def measure(args):
    """(settings, one record per case): medians on the chosen clock, ratio to ``frozen``,
    images/s (wall clock), peak CUDA memory, FLOPs."""
    device_name = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device_name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda, but CUDA is not available")
    device = torch.device(device_name)
    if args.threads:
        torch.set_num_threads(args.threads)
    settings = {key: getattr(args, key) for key in ("batch", "image_size", "classes", "rounds", "warmup", "prec",
                                                    "config_file", "weights", "mask_strategy", "clock", "flops")}
    calls, masks, prec = case_calls(settings, device)
    settings.update(device=device_name, threads=torch.get_num_threads(), prec=prec, mask_strategy=masks)
    for call in calls.values():  # first calls fill the caches (text prefix, frozen text features, masks)
        call()
    flops = count_flops(calls) if args.flops else {}
    peaks = {}
    if device.type == "cuda":  # each case's own peak: one extra call per case
        for name, call in calls.items():
            reset_peak_memory(device)
            call()
            peaks[name] = peak_memory_mib(device)
    times = time_interleaved(calls, device, args.rounds, args.warmup)
    return settings, records_from(times, args.clock, settings["batch"], flops, peaks)


def records_from(times, clock, batch, flops=None, peaks=None):
    """One record per case from its timed rounds ({case: {"wall": [s], "cpu": [s]}}).

    ``ms``, ``min_ms`` and ``max_ms`` are on ``clock``; ``ratio`` = the case's median over
    ``frozen``'s on ``clock``; ``images_per_s`` = ``batch`` / the wall-clock median.
    """
    median = medians(times)
    unit = median["frozen"][clock]
    return [{"case": name, "ms": 1000 * median[name][clock], "min_ms": 1000 * min(times[name][clock]),
             "max_ms": 1000 * max(times[name][clock]), "wall_ms": 1000 * median[name]["wall"],
             "cpu_ms": 1000 * median[name]["cpu"], "ratio": median[name][clock] / unit,
             "images_per_s": batch / median[name]["wall"], "flops": (flops or {}).get(name),
             "peak_memory_mib": (peaks or {}).get(name), "rounds": times[name]} for name in times]


HEADERS = ["case", "ms", "min ms", "max ms", "/ frozen", "img/s (wall)", "GFLOPs", "peak MiB"]


def table_rows(records):
    return [[record["case"], f"{record['ms']:.1f}", f"{record['min_ms']:.1f}", f"{record['max_ms']:.1f}",
             f"{record['ratio']:.3f}", f"{record['images_per_s']:.1f}",
             "" if record["flops"] is None else f"{record['flops'] / 1e9:.4g}",
             "" if record["peak_memory_mib"] is None else f"{record['peak_memory_mib']:.0f}"] for record in records]


def header_line(settings):
    return (f"DeAR L_reg: {settings['config_file']}; device {settings['device']} ({settings['threads']} threads), "
            f"precision {settings['prec']}, batch {settings['batch']}, image {settings['image_size']}, "
            f"{settings['classes']} classes, masks {settings['mask_strategy']}; median of {settings['rounds']} rounds "
            f"after {settings['warmup']} warm-up, {settings['clock']} clock")


def summary_lines(report):
    """L_reg's overhead in time and FLOPs, the frozen branch's share, the steps in frozen forwards."""
    record = {record["case"]: record for record in report["results"]}
    ms = {name: entry["ms"] for name, entry in record.items()}
    lines = [f"L_reg adds {100 * (ms['dear'] / ms['dear_noreg'] - 1):.1f} % to the training step "
             f"(target <= 15 %; the paper reports about 35 %); its frozen branch alone is "
             f"{100 * ms['reg_branch'] / ms['dear_noreg']:.1f} % of the step without it "
             f"and {ms['reg_branch'] / ms['frozen']:.2f}x a frozen CLIP forward",
             f"training step / frozen CLIP forward: with L_reg {ms['dear'] / ms['frozen']:.2f}x, "
             f"without {ms['dear_noreg'] / ms['frozen']:.2f}x"]
    if record["dear"]["flops"] is not None:
        flops = {name: entry["flops"] for name, entry in record.items()}
        exact = flops["dear"] == flops["dear_noreg"] + flops["reg_branch"]
        lines.append(f"L_reg adds {100 * (flops['dear'] / flops['dear_noreg'] - 1):.1f} % of the step's FLOPs; "
                     f"step with L_reg = step without + frozen branch: {'yes' if exact else 'no'}")
    return lines
