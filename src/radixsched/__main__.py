"""``python -m radixsched``: the same command line as ``radixsched`` (``radixsched.cli``'s
``__main__``: its imports with the collector paused), which exits with the command's status."""

import sys

from radixsched.cli.__main__ import program

sys.exit(program())
