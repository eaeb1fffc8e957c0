"""`python -m runner.report <sweep dir | parent run id> [--tracking-uri URI] [--out DIR]`: the command; what it does is
runner.sweeps.report.report_command's."""

import sys

from runner.sweeps.report.report_command import main

if __name__ == "__main__":
    sys.exit(main())
