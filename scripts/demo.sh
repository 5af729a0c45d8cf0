#!/usr/bin/env bash
# Set-up and the main job: three workers elect a leader on the embedded SQLite
# default, the leader is killed, and the table shows the hand-over.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$ROOT/scripts/venv.sh" sql >&2
cd "${DEMO_DIR:-$ROOT}"
exec "$ROOT/.venv/bin/consensus" demo "$@"
