"""RAPO on upstream verl through its extension points, without a fork.

Importing this package registers, in the importing process:

- ``algorithm.adv_estimator=rapo`` and ``actor_rollout_ref.actor.policy_loss.loss_mode=rapo``
  (`algos`: verl's ``register_adv_est`` / ``register_policy_loss``);
- ``trainer.v1.trainer_mode=rapo`` (`trainer`: verl's ``register_trainer``), whose advantage step
  adds ``Z_ret`` and ``F_ret`` from the data protocol (`protocol`).

The agent loop `agent_loop.RapoEnvAgentLoop` is loaded by verl from the agent-loop config
(``configs/verl_agent_loops.yaml``). verl imports this package in every process (driver and Ray
workers) when ``VERL_USE_EXTERNAL_MODULES=rapo_agents.integrations.verl`` is set, which
``scripts/verl/run_rapo_7b.sh`` does.

Example:
    >>> import rapo_agents.integrations.verl
    >>> from verl.trainer.ppo.core_algos import get_adv_estimator_fn, get_policy_loss_fn
    >>> get_adv_estimator_fn("rapo").__name__, get_policy_loss_fn("rapo").__name__
    ('compute_rapo_outcome_advantage', 'compute_policy_loss_rapo')
"""

from rapo_agents.integrations.verl import algos, trainer

__all__ = ["algos", "trainer"]
