"""`python -m moment.train` (what torchrun launches): see moment.runtime.train."""

import sys

from moment.runtime.train import main

if __name__ == "__main__":
    sys.exit(main())
