"""Print the Markdown table of the official-code comparisons from their recorded fixtures.

    python tools/fidelity_table.py                      # tests/fixtures/official
    python tools/fidelity_table.py --fixtures FOLDER

docs/fidelity.md holds its output; tests/test_fixture_table.py checks that it is current.
"""
import argparse
import sys

from vlprompt_app.fixture_table import FixtureTableError, fidelity_table


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixtures", default=None, help="folder of <method>.json fixtures (default: tests/fixtures/official)")
    args = parser.parse_args(argv)
    try:
        sys.stdout.write(fidelity_table(args.fixtures))
    except FixtureTableError as error:
        print(f"fidelity_table: {error}", file=sys.stderr)
        return 2
    return 0
