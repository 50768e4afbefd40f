"""The GPU acceptance run's data chain (the ``data`` stage): ``tools/run_protocol.py --protocol
base2new`` over the stage's photo-sized tree with one method and one seed, its runs in this
process, every data-loader pass timed (:mod:`vlprompt_app.gpu_acceptance.data` describes the
stage and its records). It lives in the command layer because it runs train.py and
run_protocol.py's commands in-process.

    python -m vlprompt_app.commands.gpu_acceptance_chain OUT SETTINGS_JSON   # data.jsonl
"""
import json
import os
import shutil
import sys
import time

from vlprompt_app.gpu_acceptance.data import LoaderWaits, _append, _run_name, protocol_argv


def chain(out_dir, settings):
    """Run the chain (see the module docstring) into data.jsonl: "pass" lines (with the run's name),
    "run" lines ({"run", "exit_status", "seconds", "images"}), then one "chain" line."""
    from unittest import mock

    from vlprompt_app.commands import run_protocol, train

    data = settings["data"]
    path = os.path.join(out_dir, "data.jsonl")
    shutil.rmtree(os.path.join(data["root"], "runs"), ignore_errors=True)  # a fresh grid: nothing is skipped
    current = {"run": None, "images": 0}

    def on_pass(record):
        record = dict(record, kind="pass", run=current["run"])
        if record["finished"]:
            current["images"] += record["images"]
        _append(path, record)
        print(json.dumps(record), flush=True)

    def measured_run(argv):
        current.update(run=_run_name(argv), images=0)
        start = time.perf_counter()
        status = original_run(argv)
        record = {"kind": "run", "run": current["run"], "exit_status": status,
                  "seconds": time.perf_counter() - start, "images": current["images"]}
        _append(path, record)
        print(json.dumps(record), flush=True)
        return status

    original_run = train.run
    start = time.perf_counter()
    with LoaderWaits(on_pass).active(), mock.patch.object(train, "run", measured_run):
        status = run_protocol.main(protocol_argv(data))
    _append(path, {"kind": "chain", "exit_status": status, "seconds": time.perf_counter() - start,
                   "method": data["method"], "classes": data["classes"]})


if __name__ == "__main__":
    chain(sys.argv[1], json.loads(sys.argv[2]))
