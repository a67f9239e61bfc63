"""``python -m rapo_cli`` runs the ``rapo`` command."""

import sys

from rapo_cli import main

sys.exit(main())
