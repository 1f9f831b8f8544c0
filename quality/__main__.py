"""``python3 -m kvtune.quality``: the calibration Job's entry point."""

import sys

from kvtune.quality.run import main_args

sys.exit(main_args())
