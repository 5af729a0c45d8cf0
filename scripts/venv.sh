#!/usr/bin/env bash
# Creates .venv (if absent) and installs consensus-api into it, editable, with
# the extras named as arguments (default: every backend and the test tools);
# then backends/consensus-redis as a user installs a third-party backend (built from its own
# directory, not editable), and benchmarks/ (editable; it adds `consensus bench`).

# Idempotent: a second run only checks what is installed.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
extras=${1:-sql,postgresql,mysql,zookeeper,etcd,kafka,spark,docs,dev}
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    echo "venv: creating .venv with $($python --version)"
    "$python" -m venv .venv
    .venv/bin/python -m pip install -q --upgrade pip
fi
echo "venv: installing consensus-api[$extras]"
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[$extras]"
echo "venv: installing backends/consensus-redis (not editable)"
.venv/bin/python -m pip install -q --disable-pip-version-check ./backends/consensus-redis
echo "venv: installing benchmarks/ (editable: the \`consensus bench\` command)"
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -e ./benchmarks
