"""`python -m bench [options]`: the interleaved benchmark of bench/run.py."""

from bench.run import main

main()
