"""The GPU acceptance report's checks: what a run must show, each passed, failed or not measured.

A check is (name, passed, detail): ``passed`` is True, False, or None when the run measured
nothing it could judge (a stage skipped or stopped before it, or a target that only a GPU can
meet, on the CPU rehearsal).
"""
from vlprompt_app.fidelity import cost

DEAR_TARGET_IMAGES_PER_S = 1500  # DeAR's training step at batch 16 with AMP on an H100 or H200
COST_CONTRACT = cost.CONTRACT_RATIO  # our step and our peak memory at most half of the official ones
COMPILE_SPEEDUP = 2.0  # a compiled step at least twice as fast as the eager one
DATA_WAIT_SHARE = 0.10  # the training step's wait for its batch under 10 % of the step
TAC_TEST = "[TAC]"  # the parameter of tests/test_cuda.py's TAC case


def _cuda_tests(report):
    tests = report.get("cuda_tests") or []
    stages = {stage["stage"]: stage for stage in report["stages"]}
    status = stages.get("cuda-tests", {})
    found = [("CUDA-only tests pass", status.get("exit_status") == 0 if "exit_status" in status else None,
              status.get("summary", ""))]
    tac = [test for test in tests if test["test"].endswith(TAC_TEST)]
    outcomes = {test["outcome"] for test in tac}
    passed = None if not tac or outcomes == {"skipped"} else outcomes == {"passed"}
    found.append(("TAC's CUDA test passes", passed, ", ".join(f"{t['test']}: {t['outcome']}" for t in tac)))
    return found


def _cases(report, on_gpu):
    settings = report.get("settings") or {}
    trainers = report["trainers"]
    errors = [record["case"] for record in trainers if "error" in record]
    found = [("every case trains and evaluates at the papers' settings", (not errors) if trainers else None,
              f"{len(trainers)} cases measured; errors: {', '.join(errors) or 'none'}")]
    cocoop = [record for record in trainers if record["trainer"] == "CoCoOp"]
    found.append((f"CoCoOp evaluates {settings.get('classes', '?')} classes at evaluation batch "
                  f"{settings.get('eval_batch', '?')}", all("error" not in r for r in cocoop) if cocoop else None,
                  "; ".join(f"{r['case']}: " + (f"{r['eval']['images_per_s']:.3g} images/s, peak "
                                                f"{r['peak_memory_mib']:.0f} MiB" if "error" not in r
                                                else r["error"][-1]) for r in cocoop)))
    speeds = {}  # DeAR's training images/s, eager and compiled
    for record in trainers:
        if record["case"] == "DeAR" and "error" not in record:
            speeds["eager"] = record["train"]["images_per_s"]
    for record in report.get("compiled") or []:
        if record["case"] == "DeAR" and "refused" not in record and "error" not in record["compiled"]:
            speeds["compiled"] = record["compiled"]["train"]["images_per_s"]
    best = max(speeds.values()) if speeds and on_gpu else None  # a target for a GPU only
    found.append((f"DeAR trains at least {DEAR_TARGET_IMAGES_PER_S} images/s (batch 16, AMP)",
                  None if best is None else best >= DEAR_TARGET_IMAGES_PER_S,
                  ", ".join(f"{name} {speed:.0f} images/s" for name, speed in speeds.items())))
    return found


def _official(report, on_gpu):
    official = (report["official"] or {}).get("results", [])
    over = [r["case"] for r in official if "error" in r or r["ours_over_official_train_ms"] > COST_CONTRACT]
    found = [(f"our step at most {COST_CONTRACT} of the official step (train ms)", (not over) if official else None,
              ", ".join(f"{r['case']} {r['ours_over_official_train_ms']:.2f}" if "error" not in r else f"{r['case']} error"
                        for r in official))]
    peaks = [r for r in official if "error" not in r and r.get("ours_over_official_peak") is not None]
    heavy = [r["case"] for r in peaks if r["ours_over_official_peak"] > COST_CONTRACT]
    found.append((f"our peak memory at most {COST_CONTRACT} of the official one (CUDA max allocated)",
                  (not heavy) if peaks and on_gpu else None,
                  ", ".join(f"{r['case']} {r['ours_peak_mib']:.0f} / {r['official_peak_mib']:.0f} MiB" for r in peaks)))
    return found


def _compiled(report, on_gpu):
    measured = [r for r in report.get("compiled") or [] if "refused" not in r]  # a declared refusal is no failure
    pairs = [r for r in measured if "error" not in r["eager"] and "error" not in r["compiled"]]
    speedups = {r["case"]: r["eager"]["train"]["wall_ms"] / r["compiled"]["train"]["wall_ms"]
                for r in pairs if r["eager"].get("train") and r["compiled"].get("train")}
    failed = [r["case"] for r in measured if r not in pairs]
    slow = [case for case, speedup in speedups.items() if speedup < COMPILE_SPEEDUP]
    passed = (not slow and not failed) if speedups and on_gpu else None
    return [(f"a compiled training step at least {COMPILE_SPEEDUP:g}x as fast as the eager one (every case "
             "measured)", passed, ", ".join([f"{case} {speedup:.2f}x" for case, speedup in speedups.items()]
                                            + [f"{case} error" for case in failed]))]


def _data(report, on_gpu):
    data = report.get("data") or {}
    runs, chain = data.get("runs", []), data.get("chain")
    statuses = [run["exit_status"] for run in runs] + ([chain["exit_status"]] if chain else [])
    found = [("the DeAR base-to-novel chain runs from the JPEG tree (train, test base, test new)",
              (chain is not None and not any(statuses)) if statuses else None,
              ", ".join(f"{run['run']} exit {run['exit_status']}" for run in runs)
              + ("" if chain else " (the chain did not finish)" if runs else ""))]
    training = [p for p in data.get("passes", []) if p["train"] and p.get("wait_share") is not None]
    shares = [p["wait_share"] for p in training]
    found.append((f"the training step waits for its batch under {100 * DATA_WAIT_SHARE:.0f} % of the step",
                  max(shares) < DATA_WAIT_SHARE if shares and on_gpu else None,
                  ", ".join(f"epoch pass {p['pass']}: {100 * p['wait_share']:.1f} %"
                            + ("" if p["finished"] else f" (first {p['batches']} batches)") for p in training)))
    return found


def checks(report):
    """[(check, passed: bool or None (not measured), detail)] of a report."""
    on_gpu = bool(report["environment"].get("gpu"))
    parity = report["parity"]
    failed = [r["case"] for r in parity if not r.get("passed")]
    found = _cuda_tests(report)
    found.append(("CUDA and CPU agree on the tiny CLIP (every case)", (not failed) if parity else None,
                  f"{len(parity)} cases; differing or failing: {', '.join(failed) or 'none'}"))
    found += _cases(report, on_gpu) + _official(report, on_gpu) + _compiled(report, on_gpu) + _data(report, on_gpu)
    stopped = [stage["stage"] for stage in report["stages"] if stage.get("stopped")]
    found.append(("every stage finished within its time", not stopped,
                  f"{report['seconds']:.0f} s in all; stopped: {', '.join(stopped) or 'none'}"))
    return found
