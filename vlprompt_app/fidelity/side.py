"""One side of a comparison in its own process: ``python -P -m vlprompt_app.fidelity.side KIND WORKDIR METHOD``.

Started by the harness with the exported official trees first on this process's PYTHONPATH (then
this repository), in the working folder WORKDIR:

* ``official``: the official outputs of METHOD on WORKDIR's request.json, inputs.pt and weights.pt,
  written to official.pt (``harness.official_outputs``);
* ``cost-ours`` / ``cost-official``: one side of ``tools/benchmark.py official`` for METHOD, written
  to <side>-<METHOD>.json (``cost.write_side``).
"""
import argparse
import sys

from .methods import METHODS

KINDS = ("official", "cost-ours", "cost-official")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("kind", choices=KINDS)
    parser.add_argument("workdir", help="the run's working folder (request, inputs and weights)")
    parser.add_argument("method", choices=sorted(METHODS))
    args = parser.parse_args(argv)
    if args.kind == "official":
        from .harness import official_outputs

        official_outputs(args.workdir, args.method)
    else:
        from .cost import write_side

        write_side(args.kind[len("cost-"):], args.workdir, args.method)
    return 0


if __name__ == "__main__":
    sys.exit(main())
