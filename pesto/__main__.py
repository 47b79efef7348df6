"""``python -m pesto`` runs the ``pesto`` command line (see :mod:`pesto.cli`)."""
import sys

from .cli import console

sys.exit(console())
