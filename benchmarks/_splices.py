"""What a retrieved step carries on multi-hop QA, and what the policy does with it, read from a run's trajectories.

A knowledge-base question follows a relation chain: ``metadata["search_queries"]`` names the entity to search at
each hop. A splice is classified by the entity its ``<search>`` names, against what the rollout had seen before it
(its own searches and earlier splices):

- ``next``: the first entity of the chain not yet seen, the step the rollout needs;
- ``repeat``: an entity already seen;
- ``later``: an entity of the chain past the next one;
- ``off_chain``: an entity outside the chain (a neighbouring question's step that shares an entity).

A hybrid rollout draws its splice at random after each tool round (``retrieve_prob``), so the rollouts of one group
that stand at the same state after their first tool round (the same hops seen) and differ only in whether a splice
came are a randomised comparison: their reward difference is the splice's effect, free of the confound that
splices fall on longer, harder episodes (``first_round_effects``).

Example:
    >>> splice_kind("B", chain=["A", "B", "C"], seen=["A"])
    'next'
    >>> splice_kind("A", chain=["A", "B", "C"], seen=["A"])
    'repeat'
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterator
from pathlib import Path

SEARCH = re.compile(r"<search>(.*?)</search>", re.S)
KINDS = ("next", "repeat", "later", "off_chain")


def searched(text: str | None) -> str | None:
    """The entity a step's ``<search>`` names, if it has one."""
    found = SEARCH.search(text or "")
    return found.group(1).strip() if found else None


def splice_kind(entity: str | None, chain: list[str], seen: list[str]) -> str:
    """One of `KINDS`: what a spliced search of ``entity`` gives a rollout that has seen ``seen`` of ``chain``."""
    needed = [hop for hop in chain if hop not in seen]
    if entity is not None and needed and entity == needed[0]:
        return "next"
    if entity in seen:
        return "repeat"
    return "later" if entity in chain else "off_chain"


def group_ids(trajectories: list[dict]) -> Iterator[tuple[int, str]]:
    """Each trajectory's group (one question at one step): a group starts with rollout 0 of a new question."""
    block, last = 0, None
    for trajectory in trajectories:
        if trajectory["task_id"] != last and trajectory["rollout_index"] == 0:
            block += 1
        last = trajectory["task_id"]
        yield block, last


def training_chains(folder: Path) -> dict[str, list[str]]:
    """Each training question's relation chain (the entity to search at each hop), from the run's config."""
    from rapo_agents.config import load_config
    from rapo_env.tasks.knowledge_base import KnowledgeBase

    env_kwargs = load_config(str(folder / "config.yaml"), []).data.env_kwargs
    return {task.id: list(task.metadata["search_queries"])
            for task in KnowledgeBase.generate(0, **env_kwargs.get("knowledge_base") or {}).split(
                "train", env_kwargs.get("hops"))}


def heldout_hops(folder: Path, evaluation: dict) -> list[int] | None:
    """The hop count of each held-out question of a run's evaluation, in its order; None unless the counts
    reproduce the evaluation's own accuracy by hop count (``eval/accuracy_hops{n}``), which checks the order."""
    from rapo_agents.config import load_config
    from rapo_agents.heldout import accuracy_by_hops
    from rapo_env.tasks.knowledge_base import KnowledgeBase

    env_kwargs = load_config(str(folder / "config.yaml"), []).data.env_kwargs
    correct = evaluation["correct"]
    tasks = KnowledgeBase.generate(0, **env_kwargs.get("knowledge_base") or {}).split(
        "test", env_kwargs.get("hops"))[: len(correct)]
    recorded = {key: value for key, value in evaluation.items() if key.startswith("eval/accuracy_hops")}
    if not recorded or accuracy_by_hops(tasks, correct) != recorded:
        return None
    return [task.metadata["hops"] for task in tasks]


def splice_content(trajectories: list[dict], chains: dict[str, list[str]]) -> dict[str, float]:
    """The share of each `KINDS` among a run's splices, and the mean reward of the rollouts holding each."""
    rewards: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for trajectory in trajectories:
        chain, seen = chains.get(trajectory["task_id"], []), []
        for step in trajectory["steps"]:
            if (own := searched(step.get("action"))) is not None:
                seen.append(own)
            spliced = searched((step.get("retrieval") or {}).get("text"))
            if step.get("retrieval"):
                rewards[splice_kind(spliced, chain, seen)].append(float(trajectory["reward"]))
            if spliced is not None:
                seen.append(spliced)
    total = sum(len(values) for values in rewards.values())
    shares = {f"splices_{kind}": len(rewards[kind]) / total if total else float("nan") for kind in KINDS}
    return shares | {f"reward_after_{kind}_splice": statistics.fmean(rewards[kind]) if rewards[kind]
                     else float("nan") for kind in KINDS}


def first_round_effects(trajectories: list[dict], chains: dict[str, list[str]]) -> list[dict]:
    """Randomised splice effects at the first tool round: for each group and state (the hops seen after the
    rollout's first tool call) that holds rollouts without a splice there and rollouts with one, the mean reward
    of each kind of spliced rollout (``next``, or ``other`` for the rest) minus that of the unspliced ones.

    Returns one record per (group, state, kind): ``{"hops": chain length, "kind": ..., "difference": ...}``.
    """
    cells: dict[tuple, dict[str, list[float]]] = {}
    for group, trajectory in zip(group_ids(trajectories), trajectories, strict=True):
        chain, steps = chains.get(trajectory["task_id"]), trajectory["steps"]
        if not chain or not steps or steps[0].get("tool") is None:
            continue  # answered (or failed) before any tool call: no tool round, no splice to draw
        seen = [entity] if (entity := searched(steps[0].get("action"))) else []
        retrieval = steps[0].get("retrieval")
        kind = "none" if not retrieval else (
            "next" if splice_kind(searched(retrieval.get("text")), chain, seen) == "next" else "other")
        state = (group, len(chain), tuple(hop in seen for hop in chain))
        cells.setdefault(state, {}).setdefault(kind, []).append(float(trajectory["reward"]))
    return [{"hops": state[1], "kind": kind, "difference": statistics.fmean(rewards) - statistics.fmean(cell["none"])}
            for state, cell in cells.items() if "none" in cell
            for kind, rewards in cell.items() if kind != "none"]


def after_two_hops(trajectories: list[dict], chains: dict[str, list[str]]) -> list[dict]:
    """3-hop questions at the moment their second hop was first seen: how it was reached (``own`` search or a
    ``splice``), what the policy did next (``answer`` at once, search the ``third`` hop, ``other``), and whether
    the response budget then cut the episode."""
    records = []
    for trajectory in trajectories:
        chain, steps = chains.get(trajectory["task_id"]), trajectory["steps"]
        if not chain or len(chain) != 3:
            continue
        seen: list[str] = []
        for index, step in enumerate(steps):
            reached = None
            if (own := searched(step.get("action"))) is not None:
                seen.append(own)
                reached = "own" if own == chain[1] and chain[0] in seen else None
            if (spliced := searched((step.get("retrieval") or {}).get("text"))) is not None:
                seen.append(spliced)
                reached = reached or ("splice" if spliced == chain[1] and chain[0] in seen else None)
            if reached:
                following = steps[index + 1].get("action", "") if index + 1 < len(steps) else ""
                then = ("answer" if "<answer>" in following else
                        "third" if searched(following) == chain[2] else "other")
                records.append({"reached": reached, "then": then, "reward": float(trajectory["reward"]),
                                "length_cut": trajectory["end_reason"] == "length"})
                break
    return records


def pooled(records: list[dict], by: tuple[str, ...], value: str) -> list[dict]:
    """Mean of ``value`` over ``records`` for each combination of the ``by`` fields, with the count and a 95%
    percentile-bootstrap interval over the records."""
    from rapo_agents.heldout import bootstrap_ci

    cells: dict[tuple, list[float]] = {}
    for record in records:
        cells.setdefault(tuple(record[key] for key in by), []).append(float(record[value]))
    rows = []
    for key, values in sorted(cells.items(), key=lambda item: tuple(map(str, item[0]))):
        low, high = bootstrap_ci(values)
        rows.append({**dict(zip(by, key, strict=True)), "n": len(values), value: statistics.fmean(values),
                     "low": low, "high": high})
    return rows
