#!/usr/bin/env bash
# The runs of bench/prm/README.md: a PRM trained on Math-Shepherd labels against an ORM trained
# on outcomes, the same solutions, steps, batch and starting weights; three seeds; the tables.
#   bash bench/prm/run.sh          # from the repository root (a fresh clone too): under 10 min
#   bash bench/prm/run.sh 0        # only seed 0
# Everything it trains goes to out/prm_bench; results.jsonl and time.json are written here.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1 # one thread a run: the model is 0.2M parameters
OUT=out/prm_bench
start=$(date +%s)
python -c "from data.arith.prepare import built_in; built_in()" >/dev/null # if missing
mkdir -p $OUT
seeds=(${@:-0 1 2})
run() { python -m nanorm.prm --seed "$1" --out_dir $OUT/seed$1 --cache_dir $OUT/cache >$OUT/seed$1.log; }
# the first seed alone: it trains the SFT policy into the cache, which the others read
run "${seeds[0]}"
tail -1 $OUT/seed${seeds[0]}.log
# the others two at a time, one per core
rest=("${seeds[@]:1}")
for ((i = 0; i < ${#rest[@]}; i += 2)); do
    pids=()
    for s in "${rest[@]:i:2}"; do
        run "$s" &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done
    for s in "${rest[@]:i:2}"; do tail -1 $OUT/seed$s.log; done
done
for s in "${seeds[@]}"; do cat $OUT/seed$s/prm.jsonl; done >bench/prm/results.jsonl
echo "{\"seconds\": $(($(date +%s) - start)), \"seeds\": \"${seeds[*]}\"}" >bench/prm/time.json
python bench/prm/report.py
