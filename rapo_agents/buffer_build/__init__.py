"""The Step-Trace Buffer's build pipeline: play experts or convert datasets, cut trajectories into steps, index.

It sits in the Agents layer because it runs experts (`rapo_agents.scripted`) in envs; the runtime buffer it
writes (`rapo_buffers`: schema, index, retriever, service, client) knows no env and no agent.

- `builder`: trajectories (JSONL of the rollout engine) -> step traces (spec §3);
- `sources`: the scripted math expert and GSM8K human solutions as trajectories;
- `defaults`: the embedded default buffer, built on first use and cached.

Example:
    >>> from rapo_agents.buffer_build.builder import BuildConfig
    >>> BuildConfig().top_k
    5
"""
