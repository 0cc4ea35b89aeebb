#!/usr/bin/env bash
# Submit a soakmatrix run to a Ray cluster as a Ray job: the driver runs on the head node, where
# `ray job submit` sets RAY_ADDRESS, so `soakmatrix run` joins that cluster instead of starting one.
#
#   RAY_DASHBOARD=http://HEAD:8265 matrix/ci/ray-job-submit.sh MATRIX.yaml [soakmatrix run options]
#   RAY_DASHBOARD=http://HEAD:8265 SOAKMATRIX_COMMAND=smoke matrix/ci/ray-job-submit.sh smoke.yaml --changed-files changed.txt
#
# Environment:
#   RAY_DASHBOARD        the cluster's dashboard/job server (default http://127.0.0.1:8265)
#   SOAKMATRIX_COMMAND   run (default) or smoke
#   SOAKMATRIX           how the head node starts soakmatrix (default: soakmatrix; e.g.
#                        "python -m soakmatrix.matrix.cli" when the console script is not on PATH)
#   SOAKMATRIX_WORKDIR   folder uploaded as the job's working dir (default: the matrix file's folder),
#                        so a matrix and its hang model need not exist on the head beforehand
#   SUBMISSION_ID        a stable id (e.g. CI build number) makes a resubmission visible as such
#
# The job's exit status is soakmatrix's (0 passed, 1 hang/crash, 2 bad matrix, 3 infrastructure);
# `ray job submit` waits for the job and exits non-zero when it failed.
set -euo pipefail

if [ $# -lt 1 ]; then
  sed -n '2,20p' "$0" >&2
  exit 2
fi
matrix=$1; shift
dashboard=${RAY_DASHBOARD:-http://127.0.0.1:8265}
command=${SOAKMATRIX_COMMAND:-run}
workdir=${SOAKMATRIX_WORKDIR:-$(dirname "$matrix")}
submission=()
[ -n "${SUBMISSION_ID:-}" ] && submission=(--submission-id "$SUBMISSION_ID")

# The matrix travels in the working dir; refer to it by its path inside that folder.
rel=$(python3 -c 'import os,sys; print(os.path.relpath(os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])))' "$matrix" "$workdir")

# ray job submit exits 0 only for a succeeded job; keep its output for the CI log.
# shellcheck disable=SC2086
exec ray job submit --address "$dashboard" --working-dir "$workdir" "${submission[@]}" -- \
  ${SOAKMATRIX:-soakmatrix} "$command" "$rel" "$@"
