"""Sources of off-policy trajectories for the buffer: the scripted math expert and GSM8K human solutions.

Trajectories of any policy run through the rollout engine need no source module: the builder
reads the JSONL the engine writes (`rapo_agents.buffer_build.builder.build_buffer_file`).
"""
