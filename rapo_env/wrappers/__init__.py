"""Gymnasium wrappers for text envs: step-trace retrieval (and the rollout engine's token-id wrappers).

Example:
    >>> from rapo_env.wrappers import StepTraceRetrievalWrapper
    >>> StepTraceRetrievalWrapper.__name__
    'StepTraceRetrievalWrapper'
"""

from rapo_env.wrappers.retrieval import RetrievalSettings, StepTraceRetrievalWrapper
from rapo_env.wrappers.token_ids import TokenIdsAction, TokenIdsObservation

__all__ = ["RetrievalSettings", "StepTraceRetrievalWrapper", "TokenIdsAction", "TokenIdsObservation"]
