"""`RapoPPOTrainer._compute_advantage` against a real TransferQueue (controller and storage on a local Ray, CPU).

The rollouts go into TransferQueue the way verl's v1 rollout writes them (``AgentLoopOutput.as_dict()``
per session under the key ``{uid}_{session}_0``, verl's own padding of the batch to a size
multiple, then the old-log-prob step's nested ``entropy``); the trainer's advantage step then reads
them back, and what it writes must equal rapo's own functions on the same rollouts.

TransferQueue's controller and each SimpleStorage unit are Ray actors that ask for one CPU each, and
``tq.init`` waits for them without a timeout: with its default two storage units it needs three
CPUs and waits forever on a two-CPU Ray. The fixture starts one storage unit and checks the CPUs first.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import pytest
import torch

pytest.importorskip("verl", reason="verl is not installed")
tq = pytest.importorskip("transfer_queue", reason="TransferQueue is not installed")
ray = pytest.importorskip("ray", reason="ray is not installed")

from tensordict import TensorDict  # noqa: E402
from transfer_queue import KVBatchMeta  # noqa: E402
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput  # noqa: E402
from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size  # noqa: E402
from verl.utils.tensordict_utils import list_of_dict_to_tensordict  # noqa: E402

from rapo_agents.integrations.verl.protocol import EXTRA_FIELD, episode_fields  # noqa: E402
from rapo_agents.integrations.verl.trainer import RapoPPOTrainer  # noqa: E402
from rapo_agents.rapo import rapo_advantages, retrieval_entropy_pairs, retrieval_reward  # noqa: E402

ADVANTAGE_WEIGHT = 0.5
SHAPING_WEIGHT = 0.1
PARTITION = "train"
OBSERVATION_ENTROPY = 7.0
"""Entropy the actor reports on masked (tool result, retrieval) tokens: it must not reach ``Z_ret``."""
BATCH_MULTIPLE = 3
"""verl pads the 8 rollouts with one synthetic row to a multiple of 3."""
TRANSFER_QUEUE_CPUS = 2
"""One for the controller actor, one for the single storage unit."""


@dataclass(frozen=True)
class Step:
    """One policy step of a rollout and the observation spliced after it."""

    entropy: float
    """``H(s)``: the mean of the step's token entropies."""
    tokens: int = 2
    observation: int = 0
    """Masked tokens after the step (a tool result, or a retrieval when ``retrieved``)."""
    retrieved: bool = False


@dataclass(frozen=True)
class Rollout:
    uid: str
    session: int
    reward: float
    steps: tuple[Step, ...]
    from_rapo_loop: bool = True
    """False: a rollout of another agent loop, without rapo's record in ``extra_fields``."""

    @property
    def key(self) -> str:
        return f"{self.uid}_{self.session}_0"  # verl's TransferQueue key: {uid}_{session_id}_{output index}

    @property
    def tag(self) -> dict:
        """The TransferQueue tag verl's rollout puts with each output."""
        response_len = len(self.response_mask)
        return {"status": "success", "prompt_len": 3, "response_len": response_len, "seq_len": 3 + response_len,
                "global_steps": 1, "min_global_steps": 0, "max_global_steps": 0}

    @property
    def response_mask(self) -> list[int]:
        return [mark for step in self.steps for mark in [1] * step.tokens + [0] * step.observation]

    @property
    def retrieval_tokens(self) -> int:
        return sum(step.observation for step in self.steps if step.retrieved)

    @property
    def retrieval_fraction(self) -> float:
        return self.retrieval_tokens / len(self.response_mask) if self.from_rapo_loop else 0.0

    def token_entropy(self) -> torch.Tensor:
        """Per response token, as verl's old-log-prob step stores it; each step's tokens average to its ``H(s)``."""
        parts = []
        for step in self.steps:
            parts.append(step.entropy + torch.linspace(-0.25, 0.25, step.tokens))
            parts.append(torch.full((step.observation,), OBSERVATION_ENTROPY))
        return torch.cat(parts)

    def agent_loop_output(self) -> AgentLoopOutput:
        spans, start = [], 0
        for step in self.steps:
            spans.append((start, start + step.tokens))
            start += step.tokens + step.observation
        extra_fields = {"min_global_steps": 0, "max_global_steps": 0}
        if self.from_rapo_loop:
            retrieved_after = [int(step.retrieved) for step in self.steps]
            extra_fields[EXTRA_FIELD] = episode_fields(spans, retrieved_after, self.retrieval_tokens, start)
        return AgentLoopOutput(
            prompt_ids=[11, 12, 13], response_ids=list(range(100, 100 + start)), response_mask=self.response_mask,
            reward_score=self.reward, num_turns=2 * len(self.steps) + 1, metrics=AgentLoopMetrics(),
            extra_fields=extra_fields,
        )


# Two questions of four rollouts each, interleaved in the batch: grouping must follow uid, not position.
ROLLOUTS = [
    Rollout("qa", 0, 1.0, (Step(1.2, 2, 3, retrieved=True), Step(0.4, 3))),  # retrieval lowers entropy
    Rollout("qb", 0, 0.0, (Step(2.0, 2, 3, retrieved=True), Step(1.0, 2, 2, retrieved=True), Step(0.5, 2))),
    Rollout("qa", 1, 0.0, (Step(0.9, 2, 2), Step(1.0, 2))),  # a tool call, no retrieval
    Rollout("qb", 1, 1.0, (Step(0.8, 4),)),
    Rollout("qa", 2, 1.0, (Step(0.6, 2, 4, retrieved=True), Step(0.9, 2))),  # retrieval raises entropy
    Rollout("qb", 2, 1.0, (Step(1.1, 2, 3, retrieved=True),)),  # no step after the retrieval: no Z_ret term
    Rollout("qa", 3, 0.0, (Step(1.5, 3),)),
    Rollout("qb", 3, 0.5, (Step(1.0, 3),), from_rapo_loop=False),
]


def rapo_reference(rollouts: list[Rollout]) -> dict[str, torch.Tensor]:
    """``Z_ret``, ``F_ret`` and the advantage of each rollout from `rapo_agents.rapo` on the declared steps."""
    num_steps = max(len(rollout.steps) for rollout in rollouts)
    step_entropies = torch.zeros(len(rollouts), num_steps)
    step_mask = torch.zeros(len(rollouts), num_steps)
    retrieved_after = torch.zeros(len(rollouts), num_steps)
    for row, rollout in enumerate(rollouts):
        if rollout.from_rapo_loop:
            for column, step in enumerate(rollout.steps):
                step_entropies[row, column], step_mask[row, column] = step.entropy, 1.0
                retrieved_after[row, column] = float(step.retrieved)
    z_ret = retrieval_reward(*retrieval_entropy_pairs(step_entropies, step_mask, retrieved_after))
    rewards = torch.tensor([rollout.reward for rollout in rollouts])
    uids = sorted({rollout.uid for rollout in rollouts})
    groups = torch.tensor([uids.index(rollout.uid) for rollout in rollouts])
    return {
        "z_ret": z_ret,
        "f_ret": torch.tensor([rollout.retrieval_fraction for rollout in rollouts]),
        "advantage": rapo_advantages(rewards, z_ret, groups, advantage_weight=ADVANTAGE_WEIGHT),
        "grpo_advantage": rapo_advantages(rewards, torch.zeros_like(z_ret), groups),
    }


def free_cpus(needed: int, wait_s: float = 60.0) -> float:
    """Ray's free CPUs once ``needed`` are free, or after ``wait_s``: the actors of a module that ran before on the
    same Ray give theirs back a moment after they are killed."""
    deadline = time.monotonic() + wait_s
    while (free := ray.available_resources().get("CPU", 0)) < needed and time.monotonic() < deadline:
        time.sleep(0.2)
    return free


@pytest.fixture(scope="module")
def transfer_queue(ray_cluster):
    """A TransferQueue (controller + one SimpleStorage unit) on the folder's two-CPU Ray, closed afterwards."""
    try:
        free = free_cpus(TRANSFER_QUEUE_CPUS)
        if free < TRANSFER_QUEUE_CPUS:
            pytest.fail(f"TransferQueue needs {TRANSFER_QUEUE_CPUS} free Ray CPUs and tq.init would wait forever; "
                        f"the running Ray has {free}")
        tq.init({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}})
        yield tq
    finally:
        tq.close()


def put_rollouts(rollouts: list[Rollout]) -> KVBatchMeta:
    """Each agent loop session puts its output with verl's tags; the replay buffer samples them as one batch."""
    for rollout in rollouts:
        fields = rollout.agent_loop_output().as_dict() | {"uid": rollout.uid, "session_id": rollout.session}
        tq.kv_batch_put(keys=[rollout.key], partition_id=PARTITION, fields=list_of_dict_to_tensordict([fields]),
                        tags=[rollout.tag])
    return KVBatchMeta(partition_id=PARTITION, keys=[r.key for r in rollouts], tags=[r.tag for r in rollouts])


def put_entropy(batch: KVBatchMeta) -> KVBatchMeta:
    """What verl's old-log-prob step adds (synthetic padding rows included), and the batch meta it returns."""
    entropy_of = {rollout.key: rollout.token_entropy() for rollout in ROLLOUTS}
    entropies = [entropy_of.get(key, torch.full((tag["response_len"],), OBSERVATION_ENTROPY))
                 for key, tag in zip(batch.keys, batch.tags, strict=True)]
    entropy = torch.nested.as_nested_tensor(entropies, layout=torch.jagged)
    return tq.kv_batch_put(keys=batch.keys, partition_id=PARTITION,
                           fields=TensorDict({"entropy": entropy}, batch_size=len(batch)))


@pytest.fixture(scope="module")
def advantage_step(transfer_queue):
    """`ROLLOUTS` through verl's rollout, padding and old-log-prob writes, then the rapo advantage step."""
    sampled = put_rollouts(ROLLOUTS)
    # verl pads a batch to a multiple of its data-parallel and mini-batch sizes with copies of the first row
    batch = put_entropy(upsample_batch_to_divisible_size(sampled, BATCH_MULTIPLE, eos_token_id=2))
    padding_keys = batch.keys[len(ROLLOUTS):]

    trainer = object.__new__(RapoPPOTrainer)  # only the advantage step: no workers, no config
    trainer.advantage_weight, trainer.shaping_weight = ADVANTAGE_WEIGHT, SHAPING_WEIGHT
    trainer.norm_adv_by_std = True
    metrics: dict[str, float] = {}
    returned = trainer._compute_advantage(batch, metrics)
    fields = ["advantages", "returns", "rollout_is_weights", "response_mask"]
    return {
        "batch": batch, "returned": returned, "metrics": metrics, "padding_keys": padding_keys,
        "written": tq.kv_batch_get(keys=sampled.keys, partition_id=PARTITION, select_fields=fields),
        "written_padding": tq.kv_batch_get(keys=padding_keys, partition_id=PARTITION, select_fields=fields),
    }


def rows(nested: torch.Tensor) -> list[torch.Tensor]:
    return list(nested.unbind())


def test_the_batch_exercises_retrieval_rewards_of_both_signs():
    z_ret = rapo_reference(ROLLOUTS)["z_ret"]
    assert z_ret[0] > 0 and z_ret[4] < 0 and z_ret[1] != 0
    assert z_ret[5] == 0 and z_ret[7] == 0  # a retrieval with no step after it; another agent loop's rollout


def test_advantages_are_rapos_fused_advantage_on_every_response_token(advantage_step):
    reference = rapo_reference(ROLLOUTS)
    written = advantage_step["written"]
    for row, (rollout, advantages) in enumerate(zip(ROLLOUTS, rows(written["advantages"]), strict=True)):
        mask = torch.tensor(rollout.response_mask, dtype=torch.float32)
        torch.testing.assert_close(advantages, reference["advantage"][row] * mask, msg=f"rollout {rollout.key}")
    for advantages, returns in zip(rows(written["advantages"]), rows(written["returns"]), strict=True):
        torch.testing.assert_close(returns, advantages)


def test_the_retrieval_reward_moves_the_advantages_away_from_grpo(advantage_step):
    reference = rapo_reference(ROLLOUTS)
    first_tokens = torch.stack([row[0] for row in rows(advantage_step["written"]["advantages"])])
    assert not torch.allclose(first_tokens, reference["grpo_advantage"])
    torch.testing.assert_close(first_tokens, reference["advantage"])


def test_rollout_is_weights_hold_the_shaping_factor_on_policy_tokens(advantage_step):
    f_ret = rapo_reference(ROLLOUTS)["f_ret"]
    assert f_ret[1] == pytest.approx(5 / 11) and f_ret[7] == 0.0
    weights = rows(advantage_step["written"]["rollout_is_weights"])
    for row, (rollout, row_weights) in enumerate(zip(ROLLOUTS, weights, strict=True)):
        mask = torch.tensor(rollout.response_mask, dtype=torch.float32)
        torch.testing.assert_close(row_weights, (1.0 + SHAPING_WEIGHT * f_ret[row]) * mask, msg=rollout.key)


def test_the_step_leaves_the_response_mask_alone(advantage_step):
    for rollout, mask in zip(ROLLOUTS, rows(advantage_step["written"]["response_mask"]), strict=True):
        assert mask.tolist() == rollout.response_mask


def test_metrics_report_the_retrieval_terms(advantage_step):
    reference = rapo_reference(ROLLOUTS)
    metrics = advantage_step["metrics"]
    assert metrics["rapo/z_ret_mean"] == pytest.approx(reference["z_ret"].mean().item(), abs=1e-6)
    assert metrics["rapo/f_ret_mean"] == pytest.approx(reference["f_ret"].mean().item(), abs=1e-6)
    assert metrics["rapo/rollouts_with_retrieval"] == pytest.approx(4 / 8)  # verl's padding row is no rollout
    assert all(math.isfinite(value) for value in metrics.values())


def test_the_returned_batch_names_the_written_fields(advantage_step):
    """verl's actor update reads exactly the fields the batch meta names, so the new ones must be there."""
    batch, returned = advantage_step["batch"], advantage_step["returned"]
    assert returned.keys == batch.keys and returned.partition_id == batch.partition_id
    assert {"advantages", "returns", "rollout_is_weights"} <= set(returned.fields)
    assert set(batch.fields) <= set(returned.fields)
    assert [tag["status"] for tag in returned.tags] == ["success"] * len(batch)
    assert [tag.get("is_padding", False) for tag in returned.tags] == [False] * len(ROLLOUTS) + [True]


def test_verls_padding_row_gets_no_advantage_and_no_shaping(advantage_step):
    """verl's padding row copies the first rollout's ``extra_fields`` (rapo's record) but has a masked response."""
    assert len(advantage_step["padding_keys"]) == 1
    written = advantage_step["written_padding"]
    for field in ["advantages", "returns", "rollout_is_weights"]:
        assert rows(written[field])[0].tolist() == [0.0], field
