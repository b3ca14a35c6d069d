"""``python -m radixsched.cli``, and the ``radixsched`` script (``program``): the same command
line."""

import gc
import sys


def program() -> int:
    """``cli.main.main``, imported with the collector paused: the start's imports make objects
    that last the process, which no pass walks (``main`` keeps it paused through the parser,
    then moves them to the oldest generation). The script imports this module first, so the
    pause comes before any import of the command line's (23 young passes otherwise)."""
    gc.disable()
    from radixsched.cli.main import main

    return main()


if __name__ == "__main__":
    sys.exit(program())
