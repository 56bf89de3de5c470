#!/usr/bin/env bash
# Runs the whole suite once per Keras backend (the backend is fixed per
# process). Extra arguments go to pytest.
set -uo pipefail
status=0
for backend in tensorflow jax torch; do
  echo "=== KERAS_BACKEND=$backend ==="
  KERAS_BACKEND=$backend TF_CPP_MIN_LOG_LEVEL=2 python -m pytest "$@" || status=1
done
exit $status
