"""``python -m msb`` = the ``msb`` command."""

from msb.cli import main

main()
