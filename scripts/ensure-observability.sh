#!/usr/bin/env bash
# Make sure the tools of the observability tests are installed: tmux (the `top`
# view is read from a tmux pane) and Prometheus with promtool (the dashboard's
# queries and the alerting rules), from Debian's packages when we can install them
# (Debian's `prometheus` package ships /usr/bin/promtool: `promtool check rules` and
# `promtool test rules` in tests/ops/test_dashboard.py need it).
# Without apt the tests that need them are skipped, with the reason.
set -euo pipefail
missing=()
command -v tmux >/dev/null 2>&1 || missing+=(tmux)
{ command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; } \
  || missing+=(prometheus)
if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" = "0" ] || [ -n "$SUDO" ]; }; then
  echo "+ installing ${missing[*]} (apt)" >&2
  $SUDO apt-get update -qq >/dev/null
  # The image blocks service start-up; the tests start their own Prometheus.
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
  exit 0
fi
echo "+ cannot install ${missing[*]} (no apt): the tests that need them will be skipped" >&2
