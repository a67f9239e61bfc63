"""``python -m rapo_agents.cli`` runs the ``rapo`` command."""

import sys

from rapo_agents.cli import main

sys.exit(main())
