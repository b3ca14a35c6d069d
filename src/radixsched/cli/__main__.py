"""``python -m radixsched.cli``: the same command line as ``radixsched``."""

import sys

from radixsched.cli.main import main

sys.exit(main())
