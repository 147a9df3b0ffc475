"""`python -m moment.train` (what torchrun launches): see moment.runtime.train."""

import sys

from moment.gcpause import freeze_for_exit, loading

with loading():  # a rank started fresh (a forked one finds it all loaded by its agent)
    from moment.runtime.models import load_optimizers
    from moment.runtime.train import main

    load_optimizers()  # torch._dynamo, which the rank's process group and step load next

if __name__ == "__main__":
    code = main()
    freeze_for_exit()  # the rank ends here: its exit need not collect torch's objects once more
    sys.exit(code)
