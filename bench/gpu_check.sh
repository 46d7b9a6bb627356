#!/usr/bin/env bash
# The CUDA paths, checked by one command whenever a GPU is at hand (on one H200: 314 s for the
# six steps, 262 s for the HH full fine-tune; bench/README.md "GPU" has that run).
#
#   bash bench/gpu_check.sh                   # on a CUDA machine
#   GPU_CHECK_HH=1 bash bench/gpu_check.sh    # also the HH recipe as a full fine-tune (~4.5 min more)
#   bash bench/gpu_check.sh --dry-run         # every step in its CPU form, smallest size (CI)
#   bash bench/gpu_check.sh compile bench     # only the steps named (fsdp and compile read ddp's run)
#   OUT=out/gpu-check bash bench/gpu_check.sh # keep the logs and runs there (default: a temp dir)
#
# Steps, each with a header, its output and one PASS/FAIL/SKIP line, then a summary; the exit
# status is 1 if any step failed:
#   1. tests       the suite's CUDA variants (tests named cuda or gpu: skipped without a GPU)
#   2. parity      bench/gpu_parity.py: bf16 autocast and FlexAttention packing against the
#                  fp32 CPU reference (same weights, same pairs, tolerance scaled by the rewards)
#   3. ddp         train_rm.py under torchrun, one process: DDP on NCCL
#   4. fsdp        the same with --fsdp; its held-out accuracy must equal ddp's (a world of one
#                  computes the same step) within 0.03 (2.5 pairs of the dry run's 32)
#   5. compile     train_rm.py --compile, one process; accuracy against ddp's within the same
#   6. bench       bench/bench_train.py --device cuda --only hf: tokens/s, peak memory and MFU of
#                  nanoRM, nanoRM packed and HF + TRL's loss (needs transformers and the HH data)
#   7. hh          GPU_CHECK_HH=1: bench/recipes/hh_smollm2.sh with every layer trained (LAYERS=0),
#                  its time and per-subset accuracy (needs the shared data)
# --dry-run runs the same steps on the CPU: device cpu, gloo instead of NCCL, a few steps, a few
# pairs (the HH recipe on 10 pairs per subset, 64 tokens), the bench in bf16 autocast as on CUDA
# (its check that the contenders' losses agree included), --compile's path with the compiler
# off (TORCHDYNAMO_DISABLE=1), so that the script cannot rot unnoticed (~2 min on 2 cores).
# The data steps read ../shared/data (SHARED=...) and are skipped where it is absent.
set -uo pipefail
cd "$(dirname "$0")/.."
DRY=0 ONLY=" "
for a in "$@"; do
    case $a in
    --dry-run) DRY=1 ;;
    tests | parity | ddp | fsdp | compile | bench | hh) ONLY+="$a " ;;
    *) echo "usage: bash bench/gpu_check.sh [--dry-run] [tests parity ddp fsdp compile bench hh]" >&2 && exit 2 ;;
    esac
done
SHARED=${SHARED:-../shared/data}
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")}
mkdir -p "$OUT"
if [ "$DRY" = 1 ]; then
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} # as torchrun sets it: steady on a shared CPU
    DEV=cpu ITERS=4 EVAL_PAIRS=32 BENCH=(--device cpu --quick --threads 1 --dtype bfloat16)
    PARITY=(--device cpu --pairs 4 --dim 64 --layers 2)
else
    if ! python -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
        echo "no CUDA device here: run 'bash bench/gpu_check.sh --dry-run' for the CPU form" >&2
        exit 2
    fi
    DEV=cuda ITERS=300 EVAL_PAIRS=1000 BENCH=(--device cuda)
    PARITY=(--device cuda)
fi
TRAIN=(--device "$DEV" --max_iters "$ITERS" --eval_interval "$ITERS" --log_interval
    "$(((ITERS + 1) / 2))" --eval_pairs "$EVAL_PAIRS" --eval_first false --overwrite)

python - <<'PY'
import platform, torch
gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), {gpu}, python {platform.python_version()}")
print(f"NCCL available: {torch.distributed.is_nccl_available()}")
PY
echo "mode: $([ "$DRY" = 1 ] && echo "dry run on the CPU" || echo "CUDA"), logs in $OUT"

NAMES=() RESULTS=() TIMES=()
step() { # step NAME FUNCTION: header, output to the terminal and $OUT/NAME.log, one result line
    local name=$1 t0=$SECONDS rc result
    [ "$ONLY" = " " ] || [[ $ONLY == *" $name "* ]] || return 0 # steps named: only those
    printf '\n===== %s: %s =====\n' "$name" "$2"
    "$2" 2>&1 | tee "$OUT/$name.log"
    rc=${PIPESTATUS[0]}
    case $rc in 0) result=PASS ;; 77) result=SKIP ;; *) result=FAIL ;; esac
    echo "$result $name ($((SECONDS - t0)) s)"
    NAMES+=("$name") RESULTS+=("$result") TIMES+=($((SECONDS - t0)))
}

held_out_acc() { # the last held-out accuracy in a run's log.jsonl
    python -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; print([x['acc'] for x in r if x['split']=='eval'][-1])" "$1/log.jsonl"
}

same_acc() { # same_acc RUN REFERENCE: held-out accuracies within 0.03, or 2 pairs of few
    local a b tol
    a=$(held_out_acc "$OUT/$1") b=$(held_out_acc "$OUT/$2") || return 1
    tol=$(python -c "print(max(0.03, 2.5 / $EVAL_PAIRS))")
    echo "held-out accuracy: $1 $a, $2 $b (tolerance $tol)"
    python -c "import sys; sys.exit(abs($a - $b) > $tol)" || { echo "FAIL: $1 differs from $2" && return 1; }
}

tests() {
    python -m pytest -q -p no:cacheprovider -k "cuda or gpu" tests/
}

parity() {
    python bench/gpu_parity.py "${PARITY[@]}"
}

ddp() {
    torchrun --standalone --nproc_per_node=1 train_rm.py "${TRAIN[@]}" --out_dir "$OUT/ddp" &&
        held_out_acc "$OUT/ddp" >/dev/null
}

fsdp() {
    torchrun --standalone --nproc_per_node=1 train_rm.py "${TRAIN[@]}" --fsdp --out_dir "$OUT/fsdp" &&
        same_acc fsdp ddp
}

compiled() { # the dry run checks the flag's path with the compiler off: Inductor on this
    # 2-core CPU took 14 minutes for 4 steps (a compile per new row length)
    [ "$DRY" = 1 ] && export TORCHDYNAMO_DISABLE=1 && echo "TORCHDYNAMO_DISABLE=1 (dry run)"
    python train_rm.py "${TRAIN[@]}" --compile --out_dir "$OUT/compile" && same_acc compile ddp
}

bench() {
    if ! python -c "import transformers" 2>/dev/null; then
        echo "transformers is not installed (pip install -r tests/requirements.txt)" && return 77
    fi
    if [ ! -d "$SHARED/hh-rlhf" ] || [ ! -f "$SHARED/llama2c/tokenizer.model" ]; then
        echo "$SHARED/hh-rlhf or $SHARED/llama2c/tokenizer.model absent" && return 77
    fi
    python bench/bench_train.py "${BENCH[@]}" --only hf --out "$OUT/bench_train.md"
}

hh() {
    local gguf=$SHARED/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf hh=$SHARED/hh-rlhf
    if [ ! -f "$gguf" ] || [ ! -d "$hh" ]; then echo "$gguf or $hh absent" && return 77; fi
    if [ "$DRY" = 1 ]; then # 10 pairs of each subset: 2 held out, 1 to train (1 step of 4)
        for f in "$hh"/*/test.jsonl.gz; do
            s=$(basename "$(dirname "$f")")
            mkdir -p "$OUT/hh-small/$s"
            python -c "import gzip,sys; r=gzip.open(sys.argv[1],'rt').readlines()[:10]; gzip.open(sys.argv[2],'wt').writelines(r)" "$f" "$OUT/hh-small/$s/test.jsonl.gz"
        done
        GGUF=$gguf HH=$OUT/hh-small DATA=$OUT/hh-data OUT=$OUT/hh LAYERS=0 BATCH=4 MAX_LEN=64 \
            MAX_TRAIN=1 bash bench/recipes/hh_smollm2.sh
    elif [ "${GPU_CHECK_HH:-0}" = 1 ]; then # every layer trained: a full fine-tune, lr 3e-5
        GGUF=$gguf HH=$hh DATA=$OUT/hh-data OUT=$OUT/hh LAYERS=0 LR=${HH_LR:-3e-5} \
            bash bench/recipes/hh_smollm2.sh
    else
        echo "set GPU_CHECK_HH=1 to run the HH recipe as a full fine-tune" && return 77
    fi
}

step tests tests
step parity parity
step ddp ddp
step fsdp fsdp
step compile compiled
step bench bench
step hh hh

printf '\n===== summary (%s, %s s, logs in %s) =====\n' \
    "$([ "$DRY" = 1 ] && echo "dry run on the CPU" || echo "CUDA")" "$SECONDS" "$OUT"
failed=0
for i in "${!NAMES[@]}"; do
    printf '%-5s %-8s %4s s\n' "${RESULTS[$i]}" "${NAMES[$i]}" "${TIMES[$i]}"
    [ "${RESULTS[$i]}" = FAIL ] && failed=1
done
exit $failed
