#!/usr/bin/env bash
# Prints the PipeFill-paper reconciliation table of docs/results.md: our model in the paper's
# regime (40B, 1K and 8K GPUs, PP 8 so that the iteration shrinks 3.12x from 1K to 8K, the
# 82 -> 26 days of the paper's Figure 1 as quoted by issue 11), one row per assumption changed.
# Every figure is simulator output (docs/simulator.md) with the assumptions of
# configs/llm40b_scale.json plus the row's flags.
#
#   tools/pipefill_sim/reconcile.sh [BUILD_DIR] [ITERATIONS]
set -euo pipefail
build=${1:-build}
iterations=${2:-100}
sim="$build/tools/pipefill_sim/pipefill-sim"
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
base=(--config "$root/configs/llm40b_scale.json" --schedule 1f1b --pp 8 --sweep-gpus 1024,8192
      --iterations "$iterations" --quiet)

rows=(
  "base (beta 0.6, gamma 0.5)|"
  "interference none (0, 0)|--mem-interference 0 --comm-interference 0"
  "interference high (1.6, 2.2)|--mem-interference 1.6 --comm-interference 2.2"
  "fill efficiency 0.7|--efficiency 0.7"
  "fill efficiency 0.5|--efficiency 0.5"
  "memory per GPU <= 32 GiB|--max-arena-gib 32"
  "memory per GPU <= 16 GiB|--max-arena-gib 16"
  "memory per GPU <= 8 GiB|--max-arena-gib 8"
  "minimum bubble 2 ms|--min-bubble-us 2000"
  "minimum bubble 10 ms|--min-bubble-us 10000"
  "minimum bubble 50 ms|--min-bubble-us 50000"
  "job mix: inference only|--mix bert_large_inference=3,resnet50_inference=2"
  "job mix: training only|--mix gpt2_small_training=1,resnet50_training=1"
  "job mix: 7B decode only|--mix llm7b_decode=1"
  "all-reduce window filled (opt-in)|--optimizer-fill"
  "no reserved SMs|--reserved-sms 0"
  "PipeFill-paper mechanism (no gate)|--strategy paper"
  "eff 0.7 + 10 ms min bubble|--efficiency 0.7 --min-bubble-us 10000"
)

echo "| row | GPUs | iter ms | idle% | main% | filled% | +fill points | GPUs' worth | gain% (relative) | slowdown% |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for row in "${rows[@]}"; do
  label=${row%%|*}
  flags=${row#*|}
  # shellcheck disable=SC2086
  "$sim" "${base[@]}" $flags --csv "$tmp/r.csv"
  python3 - "$label" "$tmp/r.csv" <<'EOF'
import csv, sys
label, path = sys.argv[1], sys.argv[2]
for r in csv.DictReader(open(path)):
    if r["error"]:
        print(f"| {label} | {r['gpus']} | n/a: {r['error']} |||||||")
        continue
    g = int(r["gpus"])
    fill = float(r["fill_gpu_equivalents"])
    print(f"| {label} | {g} | {float(r['iteration_us'])/1e3:.1f} | {100*float(r['idle_share']):.1f} | "
          f"{100*float(r['main_busy_share']):.1f} | {100*float(r['filled_share']):.1f} | {100*fill/g:.1f} | "
          f"{fill:.0f} | {100*float(r['utilisation_gain']):.1f} | {100*float(r['slowdown_fraction']):.3f} |")
EOF
done
