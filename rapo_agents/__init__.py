"""Agents for rapo: policies, the rollout engine, the RAPO algorithm, the trainer and evaluation."""
