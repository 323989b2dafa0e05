#!/usr/bin/env bash
# Runs a pipefill-sim binary over the mutated configs the ConfigMutation test writes, one
# process per input, and counts the outcomes: ok (exit 0), refused (exit 1; "named" when the
# message contains the mutated field), crash (killed by a signal), timeout (still running
# after the limit), other (any other exit status). Used to compare binaries (e.g. before and
# after a change); the ctest itself runs in process.
#
#   PIPEFILL_MUTATION_DUMP_DIR=/tmp/mut build/tests/pipefill_cluster_tests --gtest_filter='ConfigMutation*'
#   tools/pipefill_sim/run_mutations.sh build/tools/pipefill_sim/pipefill-sim /tmp/mut [seconds] > outcomes.txt
set -euo pipefail
bin=${1:?usage: run_mutations.sh pipefill-sim-binary dump-dir [timeout-seconds]}
dir=${2:?usage: run_mutations.sh pipefill-sim-binary dump-dir [timeout-seconds]}
limit=${3:-20}
export bin limit
one() {
  f=$1
  set +e
  out=$(timeout -s KILL "$limit" "$bin" --config "$f" --quiet 2>&1)
  rc=$?
  set -e
  case $rc in
    0) c=ok ;;
    1) c=refused ;;
    137) c=timeout ;;
    *) if [ "$rc" -ge 128 ]; then c=crash; else c=other$rc; fi ;;
  esac
  printf '%s|%s|%s|%s\n' "$c" "$rc" "$(basename "$f")" "$(printf '%s' "$out" | tail -1 | cut -c1-300)"
}
export -f one
find "$dir" -maxdepth 1 -name '*.json' ! -name '*.jobs.json' | sort | xargs -P "$(nproc)" -I{} bash -c 'one "$@"' _ {} \
  > "$dir/outcomes.txt"
python3 - "$dir/outcomes.txt" <<'EOF'
import collections, re, sys
safe = lambda s: re.sub(r'[^A-Za-z0-9]', '_', s)
counts = collections.Counter()
for line in open(sys.argv[1]):
    cls, rc, name, msg = (line.rstrip('\n').split('|', 3) + [''] * 4)[:4]
    stem = name[:-5].split('__')[0]
    k = name[:-5].rsplit('__', 1)[1]
    field = name[len(stem) + 2:len(name) - 5 - len(k) - 2]
    if cls == 'refused':
        # Older messages put the job type's name in parentheses inside the path.
        named = safe(field) in safe(re.sub(r" \('[^']*'\)", '', msg))
        counts['refused, field named' if named else 'refused, field not named'] += 1
    else:
        counts[cls] += 1
print(sum(counts.values()), 'inputs:', ', '.join(f'{v} {k}' for k, v in sorted(counts.items())))
EOF
cat "$dir/outcomes.txt" | grep -E '^(crash|timeout|other)' || true
