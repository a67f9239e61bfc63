#!/usr/bin/env bash
# RAPO's 7B reasoning recipe on upstream verl (>= 0.9, v1 trainer), one node of 8 GPUs.
#   pip install 'verl[vllm]' && pip install -e '.[ray]'
#   python scripts/verl/prepare_data.py --out data/verl          # or --dataset <reference train_10k.parquet>
#   rapo buffer serve ... --port 8001                            # the step-trace buffer (RAPO_RETRIEVER)
#   bash scripts/verl/run_rapo_7b.sh trainer.n_gpus_per_node=8 [more hydra overrides]
set -euo pipefail
RAPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export RAPO_ROOT
export RAPO_VERL_DATA="${RAPO_VERL_DATA:-$RAPO_ROOT/data/verl}"
export RAPO_RETRIEVER="${RAPO_RETRIEVER:-http://127.0.0.1:8001}"
# Every verl process (driver, Ray workers) imports rapo's registrations: estimator, loss, trainer.
export VERL_USE_EXTERNAL_MODULES=rapo_agents.integrations.verl
export PYTHONPATH="$RAPO_ROOT${PYTHONPATH:+:$PYTHONPATH}"
cd "$RAPO_ROOT"
exec python -m verl.trainer.main_ppo \
    --config-path="$RAPO_ROOT/configs" --config-name=verl_rapo_7b \
    "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES=$VERL_USE_EXTERNAL_MODULES" \
    "+ray_kwargs.ray_init.runtime_env.env_vars.PYTHONPATH=$PYTHONPATH" \
    "+ray_kwargs.ray_init.runtime_env.env_vars.RAPO_RETRIEVER=$RAPO_RETRIEVER" \
    "$@"
