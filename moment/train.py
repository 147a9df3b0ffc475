"""`python -m moment.train` (what torchrun launches): see moment.runtime.train."""

import sys

from moment.gcpause import freeze_for_exit
from moment.runtime.train import main

if __name__ == "__main__":
    code = main()
    freeze_for_exit()  # the rank ends here: its exit need not collect torch's objects once more
    sys.exit(code)
