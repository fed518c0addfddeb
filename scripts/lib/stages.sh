# Sourced by scripts/test.sh: runs named stages, times them, and prints a table of the times at
# exit (also when a stage fails, marking it). Bash only.
#
#   source scripts/lib/stages.sh
#   stage build bash scripts/build.sh      # runs the command as stage "build"; its status is the stage's

_stage_names=()
_stage_seconds=()
_stage_results=()

stage() {
  local name=$1 start=$SECONDS rc=0
  shift
  echo "== stage $name: $*"
  "$@" || rc=$?
  _stage_names+=("$name")
  _stage_seconds+=($((SECONDS - start)))
  _stage_results+=("$([[ $rc -eq 0 ]] && echo ok || echo "FAILED ($rc)")")
  return "$rc"
}

_stage_table() {
  local i total=0
  ((${#_stage_names[@]})) || return 0
  echo
  printf '%-16s %8s  %s\n' stage seconds result
  for i in "${!_stage_names[@]}"; do
    printf '%-16s %8d  %s\n' "${_stage_names[$i]}" "${_stage_seconds[$i]}" "${_stage_results[$i]}"
    total=$((total + _stage_seconds[i]))
  done
  printf '%-16s %8d  (%d min %d s)\n' total "$total" $((total / 60)) $((total % 60))
}
trap _stage_table EXIT

# The emulator's thread orders other than the natural one (tests/CMakeLists.txt labels those
# tests order-NAME). One order a run, chosen by KVSERVE_ORDER_ROTATION: a number (taken mod 3),
# "all", or by default the commit (HEAD's hash mod 3), so that a rerun of a commit repeats its
# choice and successive commits take the three in turn. Prints ctest arguments excluding the
# other orders' tests.
order_rotation_args() {
  local orders=(reverse warps warps-reverse) pick=${KVSERVE_ORDER_ROTATION:-}
  if [[ $pick == all ]]; then
    echo "order rotation: all thread orders" >&2
    return 0
  fi
  if [[ -n $pick && ! $pick =~ ^[0-9]+$ ]]; then
    echo "order rotation: KVSERVE_ORDER_ROTATION='$pick' is neither a number nor 'all'" >&2
    return 1
  fi
  if [[ -z $pick ]]; then
    local head
    head=$(git rev-parse --short=8 HEAD 2>/dev/null || echo 0)
    pick=$((16#$head))
  fi
  local chosen=${orders[$((pick % 3))]} skipped=()
  for o in "${orders[@]}"; do [[ $o == "$chosen" ]] || skipped+=("order-$o"); done
  echo "order rotation: KVSERVE_ORDER_ROTATION=$pick runs the '$chosen' order (others skipped)" >&2
  local IFS='|'
  echo "-LE ^(${skipped[*]})\$"
}
