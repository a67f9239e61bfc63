"""The registered environments (imported lazily through Gymnasium's string entry points)."""
