# shellcheck shell=bash
# Progress lines for long scripts (sourced): `<name> [n/m, 1m05s] what`,
# on stderr, and one summary line at the end.
#
#   progress_start NAME STEPS   start the clock; STEPS steps to come
#   progress_step WHAT...       announce the next step
#   progress_note WHAT...       a line inside the current step
#   progress_elapsed            the time since progress_start (1m05s)
#   progress_heartbeat WHAT...  while a long command runs: a line every
#                               PROGRESS_HEARTBEAT seconds (default 60);
#                               returns at once, progress_heartbeat_stop ends it
#   progress_summary WHAT...    `<name>: WHAT (total 1m05s)`

progress_start() {
  _progress_name=$1
  _progress_steps=$2
  _progress_n=0
  _progress_t0=$SECONDS
  _progress_beat=
}

progress_elapsed() {
  local s=$((SECONDS - ${_progress_t0:-$SECONDS}))
  if ((s >= 60)); then printf '%dm%02ds' $((s / 60)) $((s % 60)); else printf '%ds' "$s"; fi
}

progress_step() {
  _progress_n=$((_progress_n + 1))
  printf '%s [%d/%d, %s] %s\n' "$_progress_name" "$_progress_n" "$_progress_steps" "$(progress_elapsed)" "$*" >&2
}

progress_note() {
  printf '%s        %s\n' "$_progress_name" "$*" >&2
}

progress_heartbeat() {
  progress_heartbeat_stop
  local what="$*" every=${PROGRESS_HEARTBEAT:-60}
  (
    # Ends with the script too, should it exit without stopping it.
    while sleep "$every" && kill -0 "$$" 2>/dev/null; do
      printf '%s [%d/%d, %s] ... %s\n' "$_progress_name" "$_progress_n" "$_progress_steps" "$(progress_elapsed)" "$what" >&2
    done
  ) &
  _progress_beat=$!
}

progress_heartbeat_stop() {
  if [[ -n "${_progress_beat:-}" ]]; then
    kill "$_progress_beat" 2>/dev/null || true
    wait "$_progress_beat" 2>/dev/null || true
    _progress_beat=
  fi
}

progress_summary() {
  progress_heartbeat_stop
  printf '%s: %s (total %s)\n' "$_progress_name" "$*" "$(progress_elapsed)" >&2
}
