"""``tools/benchmark.py cocoop``: peak memory and time of CoCoOp's per-image text passes by chunk size.

CoCoOp encodes B x C prompts per batch; CoCoOpCLIP encodes TRAINER.COCOOP.TEXT_CHUNK_SIZE
(image, class) prompts at a time (and recomputes chunks in the backward pass when training
needs more than one). For one evaluation batch (no autograd), or with ``--train`` one
training step, and for each chunk size (0: all B x C prompts in one pass), a fresh process
(``python -m vlprompt_app.benchmarking.cocoop``) measures the extra resident memory at the peak
and the time, and the rows check that the logits (evaluation) or the meta-net gradient
(training) do not change (largest difference relative to the largest value).

By default the text tower has ViT-B/16's width (512), heads (8) and context length (77) but
``--text-layers`` blocks (default 2): without autograd only one block's activations are alive
at a time, so the peak does not depend on the depth, only the time does (x 6 for 12 layers);
the image tower is a tiny ViT (its cost is negligible). ``--vit-b16`` uses the whole ViT-B/16
architecture instead (12 text layers, 224 px images), which a training step needs: its
activations are kept for every layer. Random weights. Class names have 1 to 8 words (class c
has c % 8 + 1), so every chunk holds a sentence of the longest kind: the text tower computes
positions 0..max(end-of-text) of a pass, here 17 of the 77.
"""
import json
import os
import resource
import subprocess
import sys
import tempfile

import torch

from vlprompt_app.benchmarking.measure import clocks, current_rss_mib
from vlprompt.paths import repository_root
from vlprompt_app.project import import_project_package


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


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def worker(job):
    """One measurement in this process: ``job`` holds the settings, ``chunk``, ``config``,
    ``weights`` and ``logits`` (where the logits or gradient are saved); returns the record."""
    import_project_package("trainers")
    from vlprompt.methods.conditional_context import CoCoOpCLIP
    from vlprompt.clip import CLIPRunner, Tokenizer, load_clip
    from vlprompt.config import extend_cfg, get_cfg_default

    torch.set_num_threads(job["threads"])
    torch.manual_seed(0)  # the same random weights in every worker
    model, _ = load_clip(job["config"], job["weights"])
    cfg = get_cfg_default()
    extend_cfg(cfg)
    node = cfg.TRAINER.COCOOP
    node.N_CTX, node.CTX_INIT = 4, "a photo of a"
    node.TEXT_CHUNK_SIZE = job["chunk"] or job["images"] * job["classes"]
    torch.manual_seed(0)
    cocoop = CoCoOpCLIP(CLIPRunner(model), Tokenizer(job["config"]), class_names(job["classes"]), node).eval()
    size = model.visual.image_size[0]
    images = torch.randn(job["images"], 3, size, size, generator=torch.Generator().manual_seed(1))
    before = current_rss_mib()
    device = torch.device("cpu")
    start = clocks(device)
    if job["train"]:  # forward and backward of the training loss
        loss, _, _ = cocoop.train().loss(images, torch.zeros(job["images"], dtype=torch.long))
        loss.backward()
        output = cocoop.prompt_learner.meta_net.linear1.weight.grad
    else:
        with torch.no_grad():
            output = cocoop(images)
    end = clocks(device)
    torch.save(output, job["logits"])
    return {"chunk": node.TEXT_CHUNK_SIZE, "extra_peak_mib": peak_rss_mib() - before,
            "wall_ms": 1000 * (end[0] - start[0]), "cpu_ms": 1000 * (end[1] - start[1]),
            "positions": int(cocoop.prompt_learner.eot.max()) + 1}


def add_arguments(parser):
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--images", type=int, default=2)
    parser.add_argument("--chunks", type=int, nargs="+", default=[0, 1024, 256, 64],
                        help="TEXT_CHUNK_SIZE values (0: all B x C prompts in one pass)")
    parser.add_argument("--text-layers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--train", action="store_true", help="measure a training step (forward + backward)")
    parser.add_argument("--vit-b16", action="store_true", help="the whole ViT-B/16 architecture (random weights)")


def measure(args):
    """(settings, one record per chunk size): extra peak RSS, time on both clocks, MiB per
    prompt in flight, and the output's largest difference from the first chunk size's."""
    from vlprompt.testing import write_tiny_clip

    settings = {key: getattr(args, key) for key in ("classes", "images", "chunks", "text_layers", "threads", "train",
                                                    "vit_b16", "clock")}
    folder = tempfile.mkdtemp(prefix="benchmark_cocoop_")
    if args.vit_b16:
        config, weights, settings["text_layers"] = "ViT-B/16", "random", 12
    else:
        config, weights = write_tiny_clip(folder, name="cocoop-bench", config=clip_config(args.text_layers))
    records, reference = [], None
    for chunk in args.chunks:
        job = {**settings, "chunk": chunk, "config": config, "weights": weights,
               "logits": os.path.join(folder, f"logits_{chunk}.pt")}
        result = subprocess.run([sys.executable, "-m", "vlprompt_app.benchmarking.cocoop", json.dumps(job)], check=True,
                                capture_output=True, text=True, cwd=repository_root()).stdout
        record = json.loads(result.strip().splitlines()[-1])
        output = torch.load(job["logits"], weights_only=True)
        reference = output if reference is None else reference
        in_flight = min(record["chunk"], args.images * args.classes)
        record.update(case=f"chunk {record['chunk']}", ms=record[f"{args.clock}_ms"],
                      mib_per_prompt=record["extra_peak_mib"] / in_flight,
                      difference=float((output - reference).abs().max() / reference.abs().max()))
        records.append(record)
    return settings, records


HEADERS = ["case", "extra peak RSS MiB", "ms", "wall ms", "CPU ms", "MiB / prompt in flight",
           "max |difference| / max |value|"]


def table_rows(records):
    return [[record["case"], f"{record['extra_peak_mib']:.0f}", f"{record['ms']:.0f}", f"{record['wall_ms']:.0f}",
             f"{record['cpu_ms']:.0f}", f"{record['mib_per_prompt']:.3f}", f"{record['difference']:.2e}"]
            for record in records]


def header_line(settings):
    what = "training step (forward + backward)" if settings["train"] else "evaluation batch"
    return (f"CoCoOp {what}: {settings['images']} images x {settings['classes']} classes = "
            f"{settings['images'] * settings['classes']} prompts; text tower width 512, context 77, "
            f"{settings['text_layers']} layers; {settings['threads']} threads, {settings['clock']} clock")


def summary_lines(report):
    positions = {record["positions"] for record in report["results"]}
    return [f"Text positions computed per pass: {', '.join(map(str, sorted(positions)))} of 77"]


if __name__ == "__main__":
    print(json.dumps(worker(json.loads(sys.argv[1]))))
