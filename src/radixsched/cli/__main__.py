"""``python -m radixsched.cli``: the same command line as ``radixsched``."""

import gc
import sys

# The start's imports make objects that last the process: no pass walks them (``main`` keeps
# the collector paused through the parser, then moves them to the oldest generation).
gc.disable()

from radixsched.cli.main import main  # noqa: E402

sys.exit(main())
