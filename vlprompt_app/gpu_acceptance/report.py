"""The GPU acceptance report: ``acceptance.json`` (everything the stages wrote) and
``acceptance.md`` (the checks of :mod:`.checks`, then one table per stage)."""
import json
import os
import shlex
import xml.etree.ElementTree as ElementTree

from vlprompt.fileio import atomic_write, write_text
from vlprompt_app.benchmarking import per_trainer
from vlprompt_app.benchmarking.report import format_table
from vlprompt_app.fidelity import cost

from .checks import checks
from .data import protocol_argv


def _read_jsonl(path):
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _read_json(path):
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def cuda_tests(path):
    """[{"test": "tests/test_x.py::name[param]", "outcome": passed, failed, error or skipped,
    "message"}] of pytest's JUnit XML file (empty when there is none)."""
    if not os.path.exists(path):
        return []
    tests = []
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            element = case.find(kind)
            if element is not None:
                outcome, message = {"failure": "failed"}.get(kind, kind), element.get("message", "")
                break
        module = case.get("classname", "").replace(".", "/")
        tests.append({"test": f"{module}.py::{case.get('name')}", "outcome": outcome, "message": message[:300]})
    return tests


def data_records(out_dir):
    """{"tree": data_tree.json, "passes": the last line of each loader pass, "runs", "chain"} of the
    data stages (a pass stopped with its stage keeps its last partial line)."""
    lines = _read_jsonl(os.path.join(out_dir, "data.jsonl"))
    passes = {}
    for line in lines:
        if line["kind"] == "pass":
            passes[line["pass"]] = line
    chain = [line for line in lines if line["kind"] == "chain"]
    return {"tree": _read_json(os.path.join(out_dir, "data_tree.json")), "passes": list(passes.values()),
            "runs": [line for line in lines if line["kind"] == "run"], "chain": chain[-1] if chain else None}


def _official(out_dir):
    """The official stage's report, or (a stage stopped at its limit) what official.jsonl holds."""
    report = _read_json(os.path.join(out_dir, "official.json"))
    if report is not None:
        return report
    records = _read_jsonl(os.path.join(out_dir, "official.jsonl"))
    return {"settings": None, "results": records} if records else None


# --------------------------------------------------------------------------- tables

def _parity_lines(report):
    names = ["logits", "loss", "logits after step"]
    rows = [[r["case"], *(f"{r[n]:.1e}" if n in r else "" for n in names),
             "error: " + r["error"][-1] if "error" in r else ("pass" if r["passed"] else "FAIL")]
            for r in report["parity"]]
    return ["## CUDA against CPU (tiny CLIP, fp32; relative max difference; tolerance 1e-4, a test-time episode 1e-3)",
            "", format_table(rows, ["case", *names, "result"], "github")]


def _official_lines(report):
    official = report["official"] or {"settings": None, "results": []}
    unavailable = report["settings"].get("official_unavailable") or {}
    settings = official["settings"]
    rows = cost.table_rows(official["results"])
    rows += [[method, why] + [""] * (len(cost.HEADERS) - 2) for method, why in unavailable.items()]
    if settings:
        words = [cost.header_line(settings), *cost.summary_lines(official), ""]
    else:
        words = ["(the stage did not finish: the methods it measured)", ""] if official["results"] else []
    return ["## Ours against the official code", "", *words, format_table(rows, cost.HEADERS, "github")]


def _trainer_lines(report):
    records = report["trainers"]
    lines = ["## Every case at the papers' settings", "", per_trainer.header_line(report["settings"]), "",
             format_table(per_trainer.table_rows(records), per_trainer.HEADERS, "github")]
    for title, headers, rows in per_trainer.tables({"settings": report["settings"], "results": records}):
        lines += ["", "## " + title.strip(), "", format_table(rows, headers, "github")]
    return lines


COMPILED_HEADERS = ["case", "eager train ms", "compiled train ms", "train speed-up", "eager eval ms",
                    "compiled eval ms", "eval speed-up", "compile s", "graphs", "graph breaks"]


def compiled_rows(records):
    """[case, eager and compiled train ms, speed-up, eager and compiled eval ms, speed-up, compile
    s, graphs, graph breaks] (a refusing trainer: its reason; a failed case: its error)."""
    def times(eager, compiled):
        if not eager or not compiled:
            return ["", "", ""]
        return [f"{eager['wall_ms']:.1f}", f"{compiled['wall_ms']:.1f}", f"{eager['wall_ms'] / compiled['wall_ms']:.2f}"]

    rows = []
    for record in records:
        if "refused" in record:
            rows.append([record["case"], "refuses: " + record["refused"]] + [""] * (len(COMPILED_HEADERS) - 2))
            continue
        eager, compiled = record["eager"], record["compiled"]
        if "error" in eager or "error" in compiled:
            error = eager.get("error") or compiled.get("error")
            rows.append([record["case"], error[-1] if error else "?"] + [""] * (len(COMPILED_HEADERS) - 2))
            continue
        rows.append([record["case"]] + times(eager["train"], compiled["train"]) + times(eager["eval"], compiled["eval"])
                    + [f"{record['compile_s']:.1f}", str(record["graphs"]), str(record["graph_breaks"])])
    return rows


def _compiled_lines(report):
    stage = next((s for s in report["stages"] if s["stage"] == "compiled"), {})
    backend = report.get("settings", {}).get("compile_backend", "?")
    lines = [f"## Eager against compiled (the per-trainer benchmark's --compile {backend}; wall clock, same rounds)",
             ""]
    if stage.get("skipped"):
        return lines + [stage["skipped"]]
    return lines + [format_table(compiled_rows(report["compiled"]), COMPILED_HEADERS, "github")]


PASS_HEADERS = ["run", "loader pass", "batches", "images", "s", "img/s", "first batch wait s", "wait s (later batches)",
                "wait / step", "median step wait share", "max step wait share", "workers"]
RUN_HEADERS = ["run", "exit", "s (whole run: start-up, build, data, steps)", "images", "img/s end to end"]


def data_rows(data):
    """(pass rows, run rows) of the data stages' records."""
    pass_rows, epochs = [], {}
    for p in data["passes"]:
        if p["train"]:
            epochs[p["run"]] = epochs.get(p["run"], 0) + 1
            name = f"train epoch {epochs[p['run']]}" + ("" if p["finished"] else " (stopped: partial)")
        else:
            name = "test " + ("base" if p["run"] == "train_base" else "new" if p["run"] == "test_new" else p["run"])

        def share(key):
            return "" if p[key] is None else f"{100 * p[key]:.1f} %"

        pass_rows.append([p["run"], name, p["batches"], p["images"], f"{p['seconds']:.1f}",
                          f"{p['images_per_s']:.0f}" if p["images_per_s"] else "", f"{p['first_wait_s']:.2f}",
                          f"{p['wait_s']:.2f}", share("wait_share"), share("step_share_median"),
                          share("step_share_max"), p["workers"]])
    run_rows = [[r["run"], r["exit_status"], f"{r['seconds']:.1f}", r["images"],
                 f"{r['images'] / r['seconds']:.0f}"] for r in data["runs"]]
    chain = data["chain"]
    if chain:
        images = sum(r["images"] for r in data["runs"])
        run_rows.append(["whole chain", chain["exit_status"], f"{chain['seconds']:.1f}", images,
                         f"{images / chain['seconds']:.0f}"])
    return pass_rows, run_rows


def _data_lines(report):
    data, settings = report["data"], report["settings"]["data"]
    tree = data["tree"]
    lines = ["## Real-size data: a DeAR base-to-novel chain from a JPEG tree", ""]
    if tree:
        lines += [f"ImageNet layout, {tree['classes']} classes x ({tree['train']} train + {tree['val']} val) = "
                  f"{tree['images']:,} JPEGs of {tree['size'][0]}x{tree['size'][1]} ({tree['bytes'] / 2**20:.0f} MiB), "
                  + ("reused" if tree["reused"] else f"written in {tree['seconds']:.1f} s by {tree['processes']} processes")
                  + "; `" + shlex.join(["python", "tools/run_protocol.py", *protocol_argv(settings)])
                  + "`. A step's wait is the time the loader's next() blocked; the step runs from one batch's arrival "
                  "to the next.", ""]
    pass_rows, run_rows = data_rows(data)
    if pass_rows:
        lines += [format_table(pass_rows, PASS_HEADERS, "github"), ""]
    if run_rows:
        lines += [format_table(run_rows, RUN_HEADERS, "github")]
    return lines


def _tests_lines(report):
    rows = [[t["test"], t["outcome"], t["message"][:120]] for t in report["cuda_tests"]]
    return ["## CUDA-only tests", "", format_table(rows, ["test", "outcome", "message"], "github")]


def _stage_ran(report, name):
    """Whether stage ``name`` ran, or was skipped for a reason other than its selection."""
    stage = next((s for s in report["stages"] if s["stage"] == name), None)
    return stage is not None and "not selected" not in stage.get("skipped", "")


def markdown(report):
    """The report as Markdown."""
    environment = report["environment"]
    lines = [f"# GPU acceptance: {environment.get('gpu') or 'CPU rehearsal'}", "",
             f"torch {environment.get('torch')} (CUDA {environment.get('cuda')}), Python {environment.get('python')}, "
             f"{environment.get('cpu_count')} CPUs; commit {report['commit']}; {report['seconds']:.0f} s", "",
             "| check | result | detail |", "|---|---|---|"]
    for name, passed, detail in checks(report):
        lines.append(f"| {name} | {'not measured' if passed is None else 'pass' if passed else 'FAIL'} | {detail} |")
    lines += ["", "## Stages", "", format_table(
        [[s["stage"], s.get("skipped") or ("stopped at its limit" if s["stopped"] else f"exit {s['exit_status']}"),
          f"{s.get('seconds', 0):.0f}", f"{s['cpu_s']:.0f}" if "cpu_s" in s else "", f"{s.get('limit_s', 0):.0f}"]
         for s in report["stages"]], ["stage", "outcome", "s", "CPU s", "limit s"], "github")]
    sections = [(report["cuda_tests"], _tests_lines), (report["parity"], _parity_lines),
                (_stage_ran(report, "official") or report["official"], _official_lines),
                (report["trainers"], _trainer_lines),
                (_stage_ran(report, "compiled") or report["compiled"], _compiled_lines),
                (report["data"]["tree"] or report["data"]["runs"], _data_lines)]
    for present, section in sections:
        if present:
            lines += [""] + section(report)
    return "\n".join(lines) + "\n"


def write_report(out_dir, settings, stages, seconds, commit):
    """Gather the stages' files into ``acceptance.json`` and ``acceptance.md``; returns the report."""
    tests_log = os.path.join(out_dir, "logs", "cuda-tests.log")
    for stage in stages:
        if stage["stage"] == "cuda-tests" and os.path.exists(tests_log):
            with open(tests_log, encoding="utf-8", errors="replace") as f:
                tail = [line.strip() for line in f if line.strip()]
            stage["summary"] = tail[-1] if tail else ""
    report = {"settings": settings, "seconds": seconds, "commit": commit, "stages": stages,
              "environment": _read_json(os.path.join(out_dir, "environment.json")) or {},
              "cuda_tests": cuda_tests(os.path.join(out_dir, "cuda-tests.xml")),
              "parity": _read_jsonl(os.path.join(out_dir, "parity.jsonl")),
              "official": _official(out_dir),
              "trainers": _read_jsonl(os.path.join(out_dir, "trainers.jsonl")),
              "compiled": _read_jsonl(os.path.join(out_dir, "compiled.jsonl")),
              "data": data_records(out_dir)}
    report["checks"] = [{"check": name, "passed": passed, "detail": detail} for name, passed, detail in checks(report)]
    with atomic_write(os.path.join(out_dir, "acceptance.json"), "w") as f:
        json.dump(report, f, indent=1)
    write_text(markdown(report), os.path.join(out_dir, "acceptance.md"))
    return report
