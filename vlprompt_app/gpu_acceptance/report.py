"""The GPU acceptance report: ``acceptance.json`` (everything the stages wrote) and
``acceptance.md`` (the checks, then one table per stage)."""
import json
import os

from vlprompt.fileio import atomic_write, write_text
from vlprompt_app.benchmarking import per_trainer
from vlprompt_app.benchmarking.report import format_table
from vlprompt_app.fidelity import cost

DEAR_TARGET_IMAGES_PER_S = 400  # DeAR's AMP training step at batch 16 on an H100
COST_CONTRACT = cost.CONTRACT_RATIO  # our step at most half of the official step on the same GPU


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


def checks(report):
    """[(check, passed: bool or None (not measured), detail)] of a report."""
    stages = {stage["stage"]: stage for stage in report["stages"]}
    found = []
    tests = stages.get("cuda-tests", {})
    found.append(("CUDA-only tests pass", tests.get("exit_status") == 0 if "exit_status" in tests else None,
                  tests.get("summary", "")))
    parity = report["parity"]
    failed = [r["case"] for r in parity if not r.get("passed")]
    found.append(("CUDA and CPU agree on the tiny CLIP (every case)", (not failed) if parity else None,
                  f"{len(parity)} cases; differing or failing: {', '.join(failed) or 'none'}"))
    trainers = report["trainers"]
    errors = [r["case"] for r in trainers if "error" in r]
    measured = {r["case"] for r in trainers}
    found.append(("every case trains and evaluates at the papers' settings", (not errors) if trainers else None,
                  f"{len(measured)} cases measured; errors: {', '.join(errors) or 'none'}"))
    dear = next((r for r in trainers if r["case"] == "DeAR" and "error" not in r), None)
    on_gpu = bool(report["environment"].get("gpu"))
    speed = dear["train"]["images_per_s"] if dear and on_gpu else None  # a target for a GPU only
    found.append((f"DeAR trains at least {DEAR_TARGET_IMAGES_PER_S} images/s (batch 16, AMP)",
                  None if speed is None else speed >= DEAR_TARGET_IMAGES_PER_S,
                  "" if speed is None else f"{speed:.0f} images/s on {report['environment'].get('gpu') or 'CPU'}"))
    official = (report["official"] or {}).get("results", [])
    over = [r["case"] for r in official if "error" in r or r["ours_over_official_train_ms"] > COST_CONTRACT]
    found.append((f"our step at most {COST_CONTRACT} of the official step (train ms)",
                  (not over) if official else None, ", ".join(
                      f"{r['case']} {r['ours_over_official_train_ms']:.2f}" if "error" not in r else f"{r['case']} error"
                      for r in official)))
    stopped = [stage["stage"] for stage in report["stages"] if stage.get("stopped")]
    found.append(("every stage finished within its time", not stopped,
                  f"{report['seconds']:.0f} s in all; stopped: {', '.join(stopped) or 'none'}"))
    return found


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
          f"{s.get('seconds', 0):.0f}", f"{s.get('limit_s', 0):.0f}"] for s in report["stages"]],
        ["stage", "outcome", "s", "limit s"], "github")]
    if report["parity"]:
        names = ["logits", "loss", "logits after step"]
        rows = [[r["case"], *(f"{r[n]:.1e}" if n in r else "" for n in names),
                 "error: " + r["error"][-1] if "error" in r else ("pass" if r["passed"] else "FAIL")]
                for r in report["parity"]]
        lines += ["", "## CUDA against CPU (tiny CLIP, fp32; relative max difference; tolerance 1e-4, a "
                  "test-time episode 1e-3)", "",
                  format_table(rows, ["case", *names, "result"], "github")]
    if report["official"]:
        settings = report["official"]["settings"]
        lines += ["", "## Ours against the official code", "",
                  cost.header_line(settings) if settings else "(the stage was stopped: the methods measured)", "",
                  format_table(cost.table_rows(report["official"]["results"]), cost.HEADERS, "github")]
    if report["trainers"]:
        lines += ["", "## Every case at the papers' settings", "", per_trainer.header_line(report["settings"]), "",
                  format_table(per_trainer.table_rows(report["trainers"]), per_trainer.HEADERS, "github")]
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
              "parity": _read_jsonl(os.path.join(out_dir, "parity.jsonl")),
              "official": _official(out_dir),
              "trainers": _read_jsonl(os.path.join(out_dir, "trainers.jsonl"))}
    report["checks"] = [{"check": name, "passed": passed, "detail": detail} for name, passed, detail in checks(report)]
    with atomic_write(os.path.join(out_dir, "acceptance.json"), "w") as f:
        json.dump(report, f, indent=1)
    write_text(markdown(report), os.path.join(out_dir, "acceptance.md"))
    return report


def _official(out_dir):
    """The official stage's report, or (a stage stopped at its limit) what official.jsonl holds."""
    report = _read_json(os.path.join(out_dir, "official.json"))
    if report is not None:
        return report
    records = _read_jsonl(os.path.join(out_dir, "official.jsonl"))
    return {"settings": None, "results": records} if records else None
