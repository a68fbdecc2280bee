"""The package's command line: importing this module runs it, and it exits (as argparse does)."""

import sys


def main() -> None:
    print("usage: retry_function_package [-h]", file=sys.stderr)
    raise SystemExit(2)


main()
