"""``python -m radixsched``: the ``radixsched`` command line (``cli.__main__.program``)."""

from radixsched.cli.__main__ import program

raise SystemExit(program())
