"""``python -m pesto`` runs the ``pesto`` command line (see :mod:`pesto.cli`)."""
import sys

from .cli import main

sys.exit(main())
