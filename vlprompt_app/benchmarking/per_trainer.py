"""``tools/benchmark.py trainers``: cost of every registered trainer (training step, evaluation,
memory, learnable parameters).

Every trainer is built through its own class and ``build_model`` from its ViT-B/16 config
(configs/trainers/...), on the ViT-B/16 architecture with random weights (no download; the
cost does not depend on the weight values) and ``--classes`` synthetic class names instead
of a dataset. On one random batch it times, in interleaved rounds (median over ``--rounds``
after ``--warmup`` untimed rounds; the first round also fills every cache):

* ``frozen``: a plain frozen CLIP image forward of the batch (no autograd): the unit;
* ``train``: the trainer's ``forward_backward`` (forward, loss, backward, optimizer step);
  trainers whose image encoder is frozen train on cached image features (FEATURE_CACHE), as
  their configs do, so their step starts from the batch's features;
* an evaluation: the trainer's own ``test()`` over a loader of two copies of the batch, right
  after a training step, split at the batch boundaries into ``eval first`` (from the start of
  ``test()`` to the second batch: it pays whatever a method computes once per evaluation,
  e.g. the class text features) and ``eval`` (the second batch: the steady state, which sets
  evaluation images/s). Frozen-encoder trainers evaluate from images: their batch is encoded
  (``encode_image_features``) and then classified from features, as the feature cache does
  for a new test set.

The cost ratio is a time divided by the frozen forward of the same batch, measured in the
same rounds, so it transfers across machines; "text per eval" is ``eval first`` minus ``eval``
in the same unit. RAdaTTT adapts at test time: its ``eval`` is ``test()`` on one test image
(NUM_VIEWS views encoded, entropy selection, adaptation steps, prediction), compared with a
frozen forward of those views; its learnable count is what one episode tunes (``episode_learnable``:
TPT's prompt, RAda-TTT's generator), since its model's parameters stay frozen between episodes.
Peak memory is CUDA's max allocated memory, or on the CPU the peak resident set size of the
process that measured the case (one fresh process per case; weights included).

The default setting is the comparison setting of PERFORMANCE.md: batch 4 (CoCoOp 1), 50 classes, 224 px,
fp32 on the CPU with 2 threads; the table lists the issue's targets next to the ratios. Each
case is measured in a fresh process (``python -m vlprompt_app.benchmarking.per_trainer``) unless
``--in-process``. Under ``--clock cpu`` the case processes run with OMP_WAIT_POLICY=PASSIVE
(unless set): spinning OpenMP threads would add CPU time without work (a RAdaAdapter step on
cached features measured 0.05 CPU-s passive, 0.5-1.6 CPU-s spinning, on 2 threads of a loaded
machine). Images/s are always per wall-clock second.

The distance to the hardware limit (unless ``--no-flops``): after the timed rounds and the memory
peak, each call runs once more, untimed, under a FLOP counter (an evaluation split at its batch
requests as its time is), and the process measures its matmul peak in the step's dtype
(:mod:`vlprompt_app.benchmarking.flops`). A second table gives per case the FLOPs of a training
step and of an evaluation batch, the FLOPs per second of their median times and that as a
percentage of the peak, on the report's clock.

Compiled against eager (``--compile BACKEND``, a TRAIN.COMPILE backend): after building a case's
trainer, its model's step methods are compiled as TRAIN.COMPILE compiles them
(:mod:`vlprompt.engine.compilation`) and each round also runs the training step and the
evaluation with the compiled methods in place (``train compiled``, ``eval first compiled``, ``eval
compiled``), interleaved with the eager ones on the same trainer. The first round, untimed,
compiles; its time is the case's ``compile_s``. A third table gives per case the eager and
compiled medians, their ratio, the compile time and the graphs and graph breaks dynamo made. A
trainer that refuses TRAIN.COMPILE (the test-time ones) is measured eagerly and its row says why.
"""
import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import torch
from torch._dynamo.utils import counters

from vlprompt_app.benchmarking.flops import counting_flops, matmul_peak
from vlprompt_app.benchmarking.measure import clocks, current_rss_mib, peak_memory_mib, reset_peak_memory
from vlprompt_app.benchmarking.report import format_table
from vlprompt_app.benchmarking.trainer_cases import (
    SYNTHETIC_CLIP, SYNTHETIC_IMAGE_SIZE, SYNTHETIC_WEIGHTS, build_trainer, case_batch, case_named, check_coverage,
    project_trainers, select_cases, synthetic_case, training_batch,
)
from vlprompt.engine.benchmark_case import CACHED, TEST_TIME, TRAIN
from vlprompt.engine.compilation import COMPILE_BACKENDS, compile_step_methods, mark_step
from vlprompt.paths import repository_root
from vlprompt_app.project import import_project_package

ROOT = str(repository_root())

# --------------------------------------------------------------------------- measuring

class TimedBatches:
    """A test loader of ``count`` batches from ``make_batch()`` that notes ``mark()`` (default: the
    clocks) whenever ``test()`` asks for the next batch, so one evaluation is split into its batches."""

    def __init__(self, make_batch, count, device):
        self.make_batch, self.count, self.device = make_batch, count, device
        self.mark = lambda: clocks(device)
        self.requests = []

    def __len__(self):
        return self.count

    def __iter__(self):
        self.requests = []
        for _ in range(self.count):
            self.requests.append(self.mark())
            yield self.make_batch()

    @contextlib.contextmanager
    def marking(self, mark):
        """Note ``mark()`` instead of the clocks at each batch request, inside the block."""
        self.mark = mark
        try:
            yield
        finally:
            self.mark = lambda: clocks(self.device)


@dataclass
class Call:
    """One timed call of a round.

    Attributes:
        run: the function.
        parts: names of the timed intervals. One name: the whole call. Two names (an
            evaluation): from the call's start to the second batch request, then to the end.
        loader: the TimedBatches of an evaluation.
    """

    run: Callable[[], object]
    parts: Tuple[str, ...]
    loader: Optional[TimedBatches] = None


def case_calls(case, trainer, settings):
    """The case's calls in round order, {timed part: images in its batch} and {timed part: the
    frozen part it is compared with}."""
    device, size = trainer.device, settings["image_size"]
    generator = torch.Generator().manual_seed(0)
    model = trainer.model

    def random_images(count):
        return torch.randn(count, 3, size, size, generator=generator).to(device)

    def frozen(images):
        def run():
            with torch.no_grad(), trainer.autocast():
                model.clip.encode_image_plain(images)
        return run

    def evaluation(loader, parts):
        trainer.test_loader = loader  # test() evaluates this loader (no feature cache swaps it)
        return Call(trainer.test, parts, loader)

    if case.kind == TEST_TIME:  # one test image, adapted on its views inside test()
        views = random_images(trainer.episode_cfg.NUM_VIEWS)
        batch = {"img": views.unsqueeze(0), "label": torch.zeros(1, dtype=torch.long)}
        calls = [Call(frozen(views), ("frozen",)), evaluation(TimedBatches(lambda: batch, 1, device), ("eval",))]
        return calls, {"frozen": len(views), "eval": 1}, {"eval": "frozen"}

    batch = case_batch(case, settings)
    images = random_images(batch)
    labels = (torch.arange(batch) % settings["classes"]).to(device)
    calls, counts, references = [Call(frozen(images), ("frozen",))], {"frozen": batch}, {}
    if case.kind in (TRAIN, CACHED):
        train_batch = training_batch(case, trainer, images, labels)
        trainer.batch_idx, trainer.num_batches = 0, len(trainer.train_loader_x)

        def train():
            trainer.set_model_mode("train")
            trainer.forward_backward(train_batch)

        calls.append(Call(train, ("train",)))
        counts["train"], references["train"] = batch, "frozen"
    eval_batch = settings["eval_batch"] or batch
    eval_images = images if eval_batch == batch else random_images(eval_batch)
    eval_labels = (torch.arange(eval_batch) % settings["classes"]).to(device)

    def test_batch():
        if case.kind == CACHED:  # what the feature cache does for a new test set: encode, then read
            with torch.no_grad(), trainer.autocast():
                return {"features": model.encode_image_features(eval_images), "label": eval_labels}
        return {"img": eval_images, "label": eval_labels}

    calls.append(evaluation(TimedBatches(test_batch, 2, device), ("eval first", "eval")))
    counts.update({"eval first": eval_batch, "eval": eval_batch})
    frozen_eval = "frozen"
    if eval_batch != batch:
        calls.append(Call(frozen(eval_images), ("frozen eval",)))
        counts["frozen eval"], frozen_eval = eval_batch, "frozen eval"
    references.update({"eval first": frozen_eval, "eval": frozen_eval})
    return calls, counts, references


def compiled_calls(trainer, calls, backend):
    """The training and evaluation calls of ``calls`` again, with ``trainer.model``'s step methods
    compiled with ``backend`` in place while they run (parts renamed "... compiled").

    Returns:
        (the compiled calls, {"backend", "mode", "methods"}); the model stays eager between them.
    """
    model = trainer.model
    names, mode = compile_step_methods(model, backend, trainer.device)
    compiled = {name: vars(model).pop(name) for name in names}

    def with_compiled(run, is_step):
        def call():
            vars(model).update(compiled)
            trainer.compile_mode = mode
            try:
                if is_step:
                    mark_step(mode)
                return run()
            finally:
                trainer.compile_mode = None
                for name in names:
                    vars(model).pop(name)
        return call

    twins = [Call(with_compiled(call.run, call.parts == ("train",)), tuple(f"{part} compiled" for part in call.parts),
                  call.loader) for call in calls if call.parts[0] in ("train", "eval first", "eval")]
    return twins, {"backend": backend, "mode": mode or "default", "methods": names}


def time_rounds(calls, device, rounds, warmup):
    """{timed part: {"wall": [s, ...], "cpu": [s, ...]}} of the timed rounds (calls interleaved)."""
    times = {part: {"wall": [], "cpu": []} for call in calls for part in call.parts}
    for round_index in range(warmup + rounds):
        for call in calls:
            start = clocks(device)
            with quietly():
                call.run()
            end = clocks(device)
            if round_index < warmup:
                continue
            marks = [start] + (call.loader.requests[1:] if call.loader else []) + [end]
            for part, begin, finish in zip(call.parts, marks, marks[1:]):
                times[part]["wall"].append(finish[0] - begin[0])
                times[part]["cpu"].append(finish[1] - begin[1])
    return times


def count_part_flops(calls):
    """{timed part: FLOPs} of one untimed call of each of ``calls`` (an evaluation is split at
    its batch requests, as its time is)."""
    flops = {}
    for call in calls:
        with counting_flops() as counter, quietly():
            if call.loader is None:
                call.run()
            else:
                with call.loader.marking(counter.get_total_flops):
                    call.run()
            total = counter.get_total_flops()
        marks = [0] + (call.loader.requests[1:] if call.loader else []) + [total]
        flops.update({part: end - begin for part, begin, end in zip(call.parts, marks, marks[1:])})
    return flops


def quietly():
    """Silence the trainer's prints (test() reports its accuracy)."""
    stack = contextlib.ExitStack()
    stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
    stack.enter_context(contextlib.redirect_stderr(io.StringIO()))
    return stack


def measure_case(case, settings):
    """Build the case's trainer and measure it; returns the case's JSON record."""
    if settings["threads"]:
        torch.set_num_threads(settings["threads"])
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="benchmark_") as output_dir:
        trainer = build_trainer(case, settings, output_dir)
        build_s = time.perf_counter() - start
        device = trainer.device
        learnable = (trainer.episode_learnable() if case.kind == TEST_TIME  # tuned inside each episode
                     else sum(param.numel() for param in trainer.model.parameters() if param.requires_grad))
        calls, counts, references = case_calls(case, trainer, settings)
        compiled, compile_info, backend = [], None, settings.get("compile")
        if backend and trainer.compile_refusal:
            compile_info = {"backend": backend, "refused": trainer.compile_refusal}
        elif backend:
            torch._dynamo.reset()  # another case's graphs of the code objects cases share (in-process runs)
            compiled, compile_info = compiled_calls(trainer, calls, backend)
            counters.clear()
        memory_after_build = torch.cuda.memory_allocated() / 2**20 if device.type == "cuda" else current_rss_mib()
        reset_peak_memory(device)
        start = time.perf_counter()
        first_round = time_rounds(calls + compiled, device, 1, 0)  # fills the caches, compiles: not timed
        first_round_s = time.perf_counter() - start
        times = time_rounds(calls + compiled, device, settings["rounds"], settings["warmup"])
        peak = peak_memory_mib(device)
        if compiled:
            compile_info.update(compile_fields(first_round, times, settings["clock"]))
        if settings.get("flops"):  # untimed, after the timed rounds and the memory peak
            flops = count_part_flops(calls)
            matmul = matmul_peak(device, trainer.amp.dtype or torch.float32, settings["peak_size"],
                                 settings["peak_repeats"])
        else:
            flops = matmul = None
    return {
        "case": case.name, "trainer": case.trainer, "config": f"configs/trainers/{case.config}", "kind": case.kind,
        "opts": list(case.opts), "batch": case_batch(case, settings), "learnable_params": learnable,
        **timing_fields(case, settings["clock"], times, counts, references),
        "peak_memory_mib": peak, "memory_after_build_mib": memory_after_build,
        "memory_kind": "cuda max allocated" if device.type == "cuda" else "process peak RSS",
        "build_s": build_s, "first_round_s": first_round_s, "rounds": times, "flops": flops, "matmul_peak": matmul,
        "compile": compile_info,
    }


def compile_fields(first_round, times, clock):
    """{"compile_s", "graphs", "graph_breaks", and per part "train"/"eval"/"eval first": {"eager_ms",
    "compiled_ms"}}: the first round's wall time of the compiled calls less the eager ones' (what
    compiling cost, the C++ compiler's processes included), dynamo's counts, and the medians of the
    timed rounds on ``clock``."""
    def first(part):
        return first_round[part]["wall"][0] if part in first_round else 0.0

    parts = [part for part in ("train", "eval first", "eval") if f"{part} compiled" in times]
    fields = {"compile_s": sum(first(f"{part} compiled") - first(part) for part in parts),
              "graphs": counters["stats"]["unique_graphs"], "graph_breaks": sum(counters["graph_break"].values())}
    for part in parts:
        fields[part] = {f"{kind}_ms": 1000 * statistics.median(times[name][clock])
                        for kind, name in (("eager", part), ("compiled", f"{part} compiled"))}
    return fields


def timing_fields(case, clock, times, counts, references):
    """The timing fields of a case's record, from its timed rounds.

    Args:
        case: the Case (targets and official ratios).
        clock: "wall" or "cpu": the clock whose medians give the ratios.
        times: {part: {"wall": [s, ...], "cpu": [s, ...]}} (time_rounds).
        counts: {part: images in its batch}.
        references: {part: the frozen part it is divided by}.

    Returns:
        {"frozen", "train", "eval", "eval_first_ratio", "text_per_evaluation_ratio"}: ``train``
        and ``eval`` are None for a case without that part; a ratio is the median of the part
        divided by the median of its reference, on ``clock``; ``passed`` compares it with the
        case's target.
    """
    median = {part: {key: statistics.median(values) for key, values in entry.items()} for part, entry in times.items()}

    def ratio(part):
        return median[part][clock] / median[references[part]][clock]

    def entry(part, target, official):
        if part not in median:
            return None
        return {
            "wall_ms": 1000 * median[part]["wall"], "cpu_ms": 1000 * median[part]["cpu"],
            "images": counts[part], "images_per_s": counts[part] / median[part]["wall"],
            "ratio": ratio(part), "target": target, "passed": None if target is None else ratio(part) <= target,
            "official_ratio": official, "frozen_batch": counts[references[part]],
        }

    text_per_evaluation = None
    if "eval first" in median:
        text_per_evaluation = ratio("eval first") - ratio("eval")
    return {
        "frozen": {"wall_ms": 1000 * median["frozen"]["wall"], "cpu_ms": 1000 * median["frozen"]["cpu"],
                   "images": counts["frozen"]},
        "train": entry("train", case.train_target, case.official_train),
        "eval": entry("eval", case.eval_target, case.official_eval),
        "eval_first_ratio": ratio("eval first") if "eval first" in median else None,
        "text_per_evaluation_ratio": text_per_evaluation,
    }


# --------------------------------------------------------------------------- running and reporting

def run_in_subprocess(case, settings):
    """measure_case in a fresh process (clean peak memory); the record, or {"case", "error"}."""
    command = [sys.executable, "-m", "vlprompt_app.benchmarking.per_trainer", case.name, json.dumps(settings)]
    environment = dict(os.environ, OMP_NUM_THREADS=str(settings["threads"] or os.cpu_count()))
    if settings["clock"] == "cpu":  # idle OpenMP threads sleep instead of spinning, which CPU time would count
        environment.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=environment)
    if result.returncode != 0:
        return {"case": case.name, "trainer": case.trainer, "error": result.stderr.strip().splitlines()[-5:]}
    return json.loads(result.stdout.strip().splitlines()[-1])


def target_cell(entry):
    if entry is None or entry["target"] is None:
        return ""
    return f"<= {entry['target']:g} {'pass' if entry['passed'] else 'FAIL'}"


def table_rows(records):
    """Rows of the printed table, one per record."""
    rows = []
    for record in records:
        if "error" in record:
            rows.append([record["case"], "error: " + (record["error"][-1] if record["error"] else "?")])
            continue
        train, evaluation = record["train"], record["eval"]
        text = record["text_per_evaluation_ratio"]
        rows.append([
            record["case"], record["batch"], f"{record['learnable_params']:,}",
            f"{train['wall_ms']:.0f}" if train else "", f"{train['images_per_s']:.3g}" if train else "",
            f"{train['ratio']:.3f}" if train else "", target_cell(train),
            f"{train['official_ratio']:g}" if train and train["official_ratio"] else "",
            f"{evaluation['images_per_s']:.3g}", f"{evaluation['ratio']:.2f}", target_cell(evaluation),
            evaluation["official_ratio"] or "", "" if text is None else f"{max(text, 0.0):.2f}",
            f"{record['peak_memory_mib']:.0f}",
        ])
    return rows


HEADERS = ["case", "B", "learnable", "train ms", "train img/s", "train / frozen", "target", "official",
           "eval img/s", "eval / frozen", "target", "official", "text per eval", "peak MiB"]


def progress_line(record):
    """One line per measured case, printed as soon as it is done."""
    if "error" in record:
        return f"{record['case']}: failed: " + " | ".join(record["error"])
    parts = [f"{name} / frozen {record[name]['ratio']:.3f}" for name in ("train", "eval") if record[name]]
    return f"{record['case']}: " + ", ".join(parts) + f" (built in {record['build_s']:.0f} s)"


def header_line(settings):
    threads = settings["threads"] or "default"
    configs = "each case's synthetic config, " if settings.get("synthetic") else ""

    def shown(path):
        return os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep) else path

    return (f"device {settings['device']} ({threads} threads), precision {settings['prec']}, {configs}"
            f"{shown(settings['backbone'])} ({shown(settings['weights'])} weights), {settings['image_size']} px, "
            f"batch {settings['batch']} (CoCoOp 1), eval batch {settings['eval_batch'] or 'as train'}, "
            f"{settings['classes']} classes; median of {settings['rounds']} rounds after {settings['warmup']} "
            f"warm-up, {settings['clock']} clock")


def summary_lines(report):
    """Nothing under the table: the ratios are its columns."""
    return []


LIMIT_HEADERS = ["case", "B", "train GFLOP", "eval GFLOP", "frozen GFLOP", "peak GFLOP/s", "train GFLOP/s",
                 "train % peak", "eval GFLOP/s", "eval % peak", "frozen % peak"]


def achieved(record, part, clock):
    """(FLOPs per second of ``part``'s median time on ``clock``, that as a fraction of the case's
    measured matmul peak on the same clock), or None when the case has no such part."""
    flops, entry = record["flops"].get(part), record.get(part)
    if flops is None or entry is None:
        return None
    per_second = flops / (entry[f"{clock}_ms"] / 1000)
    return per_second, per_second / record["matmul_peak"]["flops_per_s"][clock]


def limit_rows(records, clock):
    """Rows of the distance-to-the-limit table: FLOPs per call, FLOPs per second on ``clock`` and
    the fraction of the peak, for the records that counted FLOPs."""
    def giga(value):
        return "" if value is None else f"{value / 1e9:.4g}"

    rows = []
    for record in records:
        if "error" in record or not record.get("flops"):
            continue
        speeds = {part: achieved(record, part, clock) for part in ("train", "eval", "frozen")}
        cells = []
        for part in ("train", "eval", "frozen"):
            pair = speeds[part]
            cells.append(["", ""] if pair is None else [giga(pair[0]), f"{100 * pair[1]:.3g}"])
        rows.append([record["case"], record["batch"], giga(record["flops"].get("train")),
                     giga(record["flops"]["eval"]), giga(record["flops"]["frozen"]),
                     giga(record["matmul_peak"]["flops_per_s"][clock]), *cells[0], *cells[1], cells[2][1]])
    return rows


def tables(report):
    """Under the main table: the distance-to-the-limit table when the run counted FLOPs, and the
    compiled-against-eager table with ``--compile``."""
    settings = report["settings"]
    found = []
    rows = limit_rows(report["results"], settings["clock"])
    if rows:
        peak = next(record["matmul_peak"] for record in report["results"] if record.get("matmul_peak"))
        per = "CPU-second" if settings["clock"] == "cpu" else "second"
        title = (f"\nDistance to the limit: FLOPs counted by FlopCounterMode (matrix products and attention, "
                 f"forward and backward) per call, per {per} of its median time ({settings['clock']} clock), and "
                 f"as a percentage of the peak measured in the case's process (best of {peak['repeats']} "
                 f"{peak['size']}x{peak['size']} {peak['dtype']} matmuls)")
        found.append((title, LIMIT_HEADERS, rows))
    if settings.get("compile"):
        modes = sorted({record["compile"]["mode"] for record in report["results"]
                        if (record.get("compile") or {}).get("mode")})
        title = (f"\nCompiled against eager: TRAIN.COMPILE {settings['compile']} (mode {', '.join(modes) or '-'}), "
                 f"median ms of the same rounds ({settings['clock']} clock), eager / compiled (> 1: compiled is "
                 "faster), the first round's extra wall time (compiling) and dynamo's graphs and graph breaks")
        refusals = {}
        for record in report["results"]:
            if "refused" in (record.get("compile") or {}):
                refusals.setdefault(record["compile"]["refused"], []).append(record["case"])
        title += "".join(f"\nNot compiled ({', '.join(cases)}): {why}" for why, cases in refusals.items())
        found.append((title, COMPILE_HEADERS, compile_rows(report["results"])))
    return found


COMPILE_HEADERS = ["case", "train eager", "train compiled", "train speed-up", "eval eager", "eval compiled",
                   "eval speed-up", "eval first eager", "eval first compiled", "compile s (wall)", "graphs", "breaks"]


def compile_rows(records):
    """Rows of the compiled-against-eager table (a refusing trainer's row gives its reason)."""
    rows = []
    for record in records:
        info = record.get("compile") or {}
        if "error" in record or not info:
            continue
        if "refused" in info:
            rows.append([record["case"], "refuses TRAIN.COMPILE"])
            continue
        cells = []
        for part in ("train", "eval"):
            times = info.get(part)
            cells += (["", "", ""] if times is None else
                      [f"{times['eager_ms']:.1f}", f"{times['compiled_ms']:.1f}",
                       f"{times['eager_ms'] / times['compiled_ms']:.2f}"])
        first = info.get("eval first")
        cells += ["", ""] if first is None else [f"{first['eager_ms']:.1f}", f"{first['compiled_ms']:.1f}"]
        rows.append([record["case"], *cells, f"{info['compile_s']:.1f}", info["graphs"], info["graph_breaks"]])
    return rows


def comparison_lines(report, before, before_path, table_format):
    """The ratios of an earlier report ``before`` (read from ``before_path``) next to this one's."""
    return [f"\nCost ratios: {before_path} (commit {before['commit']}) -> this run (commit {report['commit']})",
            format_table(comparison_rows(before["results"], report["results"]),
                         ["case", "train before", "train now", "eval before", "eval now"], table_format)]


def add_arguments(parser):
    parser.add_argument("--trainers", nargs="+", default=[], help="trainer or case names (default: all)")
    parser.add_argument("--batch", type=int, default=4, help="training batch (CoCoOp and RAdaTTT keep 1)")
    parser.add_argument("--eval-batch", type=int, default=0, help="evaluation batch (0: the training batch)")
    parser.add_argument("--classes", type=int, default=50)
    parser.add_argument("--image-size", type=int, help="default: 224 (32 with --synthetic)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--prec", choices=("fp32", "amp", "fp16", "bf16"), default="fp32",
                        help="TRAINER.<NAME>.PREC of every case (CUDA only; the CPU runs fp32)")
    parser.add_argument("--amp", dest="prec", action="store_const", const="amp", help="same as --prec amp")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds after the cache-filling first one")
    parser.add_argument("--backbone", help="MODEL.BACKBONE.NAME (an open_clip config JSON too; default: ViT-B/16, "
                                           "with --synthetic configs/clip/tiny-synthetic-clip.json)")
    parser.add_argument("--weights", help="MODEL.BACKBONE.WEIGHTS (default: random, with --synthetic "
                                          "weights/tiny-synthetic-clip.pt)")
    parser.add_argument("--synthetic", action="store_true",
                        help="build every case from its synthetic config (Case.synthetic_config) for the tiny CLIP")
    parser.add_argument("--compare", metavar="JSON", help="also print the ratios of this earlier run next to ours")
    parser.add_argument("--in-process", action="store_true",
                        help="measure every case in this process (faster; peak RSS then accumulates)")
    parser.add_argument("--no-flops", dest="flops", action="store_false",
                        help="do not count FLOPs nor measure the matmul peak (the distance-to-the-limit table)")
    parser.add_argument("--peak-size", type=int, default=2048, help="the peak's matmul is [N, N] @ [N, N]")
    parser.add_argument("--peak-repeats", type=int, default=5, help="timed peak matmuls (the best counts)")
    parser.add_argument("--compile", choices=COMPILE_BACKENDS, default="",
                        help="also time every case's step and evaluation compiled with this TRAIN.COMPILE backend, "
                             "in the same rounds as the eager ones")
    parser.add_argument("opts", nargs=argparse.REMAINDER, help="KEY VALUE config overrides for every case")


def measure(args):
    """(settings, records) of the selected cases; prints one progress line per case.

    Raises:
        BenchmarkCoverageError: a trainer of the ``trainers`` package has no case.
    """
    import_project_package("trainers")
    check_coverage(project_trainers())
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda, but CUDA is not available")
    settings = settings_of(args)
    records = []
    for case in select_cases(args.trainers):
        case = synthetic_case(case) if args.synthetic else case
        record = measure_case(case, settings) if args.in_process else run_in_subprocess(case, settings)
        records.append(record)
        print(progress_line(record), flush=True)
    return settings, records


def settings_of(args):
    """The run's settings from the parsed command line: backbone, weights and image size default
    to ViT-B/16, random weights and 224 px, or to the tiny synthetic CLIP's with ``--synthetic``."""
    settings = {key: getattr(args, key) for key in ("batch", "eval_batch", "classes", "device", "prec", "threads",
                                                    "rounds", "warmup", "clock", "synthetic", "flops", "peak_size",
                                                    "peak_repeats", "compile")}
    defaults = ((SYNTHETIC_CLIP, SYNTHETIC_WEIGHTS, SYNTHETIC_IMAGE_SIZE) if args.synthetic
                else ("ViT-B/16", "random", 224))
    for key, default in zip(("backbone", "weights", "image_size"), defaults):
        settings[key] = default if getattr(args, key) is None else getattr(args, key)
    settings["opts"] = args.opts
    return settings


def comparison_rows(before, after):
    """[case, train ratio before, now, eval ratio before, now] for the cases of ``after``."""
    earlier = {record["case"]: record for record in before if "error" not in record}

    def ratio(record, name, digits):
        return f"{record[name]['ratio']:.{digits}f}" if record and record.get(name) else ""

    return [[record["case"], ratio(earlier.get(record["case"]), "train", 3), ratio(record, "train", 3),
             ratio(earlier.get(record["case"]), "eval", 2), ratio(record, "eval", 2)]
            for record in after if "error" not in record]


def worker(argv):
    """``python -m vlprompt_app.benchmarking.per_trainer CASE SETTINGS_JSON``: prints the case's record as JSON."""
    name, settings = argv[0], json.loads(argv[1])
    import_project_package("trainers")
    case = synthetic_case(case_named(name)) if settings.get("synthetic") else case_named(name)
    print(json.dumps(measure_case(case, settings)))


if __name__ == "__main__":
    worker(sys.argv[1:])
