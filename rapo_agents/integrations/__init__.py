"""Bridges from rapo to other engines: Ray rollouts, verl (RAPO without a fork) and skrl.

Each bridge lives in its own module and imports its engine only when it is imported itself, so
rapo works without any of them installed (extras ``[ray]``, ``[skrl]``; verl installs on its own).
"""
