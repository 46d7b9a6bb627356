#!/usr/bin/env bash
# The runs of bench/judge/README.md: the SFT policy as a generative judge (Yes/No, and A/B
# between two answers) against the pairwise reward model bench/dpo trains, all on the same 5,000
# pairs with the same steps, batch and starting weights (the SFT policy), three seeds; then every
# model scored on the held-out pairs and two shifted sets, and the tables.
#   bash bench/judge/run.sh        # from the repository root (a fresh clone too): under 10 min
#   bash bench/judge/run.sh 0      # only the seed-0 runs
# Everything it trains goes to out/judge_bench; scores.jsonl and time.json are written here.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1 # one core a job: the model is 0.2M parameters; two jobs at a time
OUT=out/judge_bench
STEPS=150
BATCH=32
PAIRS=5000
SEEDS=${*:-0 1 2}
start=$(date +%s)
python -c "from data.arith.prepare import built_in; built_in()" >/dev/null # if missing
# held-out sets away from training, in the built-in tokenizer (bench/dpo's): numbers up to 99
# (training's stop at 9), and multiplication (training asks + and -)
python data/arith/prepare.py --out_dir $OUT/long --max_operand 99 --n_val 1000 --n_train 1 \
    --tokenizer data/arith/tok.model --seed 1 >/dev/null
python data/arith/prepare.py --out_dir $OUT/mul --ops "*" --n_val 1000 --n_train 1 \
    --tokenizer data/arith/tok.model --seed 1 >/dev/null
# the first 5,000 training pairs as a dataset folder for train_rm.py (nanorm.judge: --pairs)
[ -f $OUT/pairs$PAIRS/meta.json ] ||
    python -c "from nanorm.rl import subset_of; subset_of('data/arith', '$OUT/pairs$PAIRS', $PAIRS)"

judge() { # judge KIND SEED
    python -m nanorm.judge --judge "$1" --seed "$2" --cache_dir $OUT/cache --out_dir \
        "$OUT/$1_seed$2" --steps $STEPS --batch_size $BATCH --pairs $PAIRS --log_interval 50 |
        tail -1
}
rm_() { # the explicit pairwise RM of bench/dpo (--lm_coef 0), from the SFT policy
    same="--max_iters $STEPS --batch_size $BATCH --dataset $OUT/pairs$PAIRS"
    same="$same --init $OUT/cache/sft400_policy.pt --warmup 20 --eval_interval $STEPS"
    same="$same --eval_first false --eval_pairs 100 --dtype float32 --device cpu"
    python train_rm.py $same --overwrite true --log_interval 100 --lm_coef 0 --seed "$1" \
        --out_dir "$OUT/rm_seed$1" | tail -1
}
# the first judge trains the SFT policy into the cache, which every other model starts from
first=${SEEDS%% *}
judge yes_no "$first"
jobs=()
for seed in $SEEDS; do
    [ "$seed" = "$first" ] || jobs+=("judge yes_no $seed")
    jobs+=("judge a_b $seed" "rm_ $seed")
done
pids=()
for job in "${jobs[@]}"; do # two at a time, one per core; a job that fails stops the run
    if [ ${#pids[@]} -ge 2 ]; then
        wait "${pids[0]}"
        pids=("${pids[@]:1}")
    fi
    $job &
    pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
python bench/judge/score.py $OUT $SEEDS
echo "{\"seconds\": $(($(date +%s) - start)), \"seeds\": \"$SEEDS\"}" >bench/judge/time.json
python bench/judge/report.py
