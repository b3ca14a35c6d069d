"""``python -m radixsched``: the same command line as ``radixsched``, run by ``radixsched.cli``'s
``__main__`` (its imports with the collector paused), which exits with the command's status."""

import radixsched.cli.__main__  # noqa: F401
