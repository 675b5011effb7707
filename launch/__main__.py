"""`python -m launch`: what `make run` runs (launch/run.py)."""

from launch.run import main

main()
