#!/usr/bin/env bash
# The runs of bench/rl/README.md: PPO against a learned proxy (two proxies, two KL
# coefficients, two seeds each) and GRPO against the verifier, then the table and the figure.
#   bash bench/rl/run.sh              # from the repository root; ~20 min on a 2-core CPU
#   bash bench/rl/run.sh 1            # only the seed-1 runs
# The SFT policy and the proxies are trained once, into out/rl_cache, and reused by every run.
set -euo pipefail
cd "$(dirname "$0")/../.."
# The curves here were measured with MKL's own kernels on an AMD EPYC Zen 4: on another CPU (other
# kernels, sums in another order) the runs differ in detail, and bench/rl/README.md says what held
# on both seeds.
run() {
    local name=$1
    shift
    python -m nanorm.rl --cache_dir out/rl_cache --out_dir "out/rl/$name" "$@" | grep -v "^step [0-9]*/"
    cp "out/rl/$name/rl.jsonl" "bench/rl/$name.jsonl"
}
for seed in ${@:-0 1}; do
    run "ppo_proxy5000_kl0.02_seed$seed" --algo ppo --reward proxy --kl_coef 0.02 --seed $seed
    run "ppo_proxy5000_kl0.1_seed$seed" --algo ppo --reward proxy --kl_coef 0.1 --seed $seed
    run "ppo_proxy1000_kl0.02_seed$seed" --algo ppo --reward proxy --kl_coef 0.02 --seed $seed \
        --proxy_pairs 1000
    run "grpo_verifier_kl0.02_seed$seed" --algo grpo --reward verifier --kl_coef 0.02 --seed $seed
done
if [[ " ${*:-0 1} " == *" 1 "* ]]; then  # seed 1 had not turned down by step 100: 200 steps
    run "ppo_proxy5000_kl0.02_seed1_200steps" --algo ppo --reward proxy --kl_coef 0.02 --seed 1 \
        --max_steps 200
fi
python bench/rl/report.py
