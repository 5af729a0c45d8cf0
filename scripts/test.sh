#!/usr/bin/env bash
# Set-up and the whole test suite with every real server: lint and types, the
# project's own tests, and the conformance suite on SQLite, PostgreSQL,
# ZooKeeper, etcd and Kafka (one process each, in parallel, each with its own
# real server). Ends with one line "tests: N passed, N failed".
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
bash scripts/install.sh || exit 2
bash scripts/venv.sh || exit 2
export PATH="$ROOT/.venv/bin:$PATH"
out=$(mktemp -d "${TMPDIR:-/tmp}/consensus-test.XXXXXX")
status=0

echo "== lint and types"
ruff check . || status=1
ruff format --check . || status=1
mypy || status=1

backends=${CONSENSUS_BACKENDS:-sqlite postgresql zookeeper etcd kafka}
echo "== conformance on: $backends (parallel) and the project's own tests"
for b in $backends; do
    consensus servers run "$b" -- consensus conformance '$CONSENSUS_URL' --json \
        >"$out/$b.json" 2>"$out/$b.log" &
done
pytest -q -p no:cacheprovider --junitxml="$out/own.xml" tests >"$out/own.log" 2>&1 &
wait

own_passed=0 own_failed=1
if [ -f "$out/own.xml" ]; then
    read -r own_passed own_failed < <(python - "$out/own.xml" <<'PY'
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
suite = root if root.tag == "testsuite" else root.find("testsuite")
tests, failures, errors, skipped = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
print(tests - failures - errors - skipped, failures + errors + skipped)
PY
    )
fi
tail -n 15 "$out/own.log"
[ "$own_failed" = 0 ] || { status=1; cat "$out/own.log"; }

python - "$out" $backends <<'PY' || status=1
import json, pathlib, sys
from rich.console import Console
from rich.table import Table
out, backends = pathlib.Path(sys.argv[1]), sys.argv[2:]
table = Table(title="conformance")
for column in ("backend", "passed", "failed", "skipped"):
    table.add_column(column, justify="right" if column != "backend" else "left")
bad = False
for b in backends:
    try:
        r = json.loads((out / f"{b}.json").read_text())
    except (OSError, ValueError):
        r = {"passed": 0, "failed": 1, "skipped": 0}
        print((out / f"{b}.log").read_text()[-6000:])
    bad |= r["failed"] > 0 or r["skipped"] > 0 or r["passed"] == 0
    table.add_row(b, str(r["passed"]), str(r["failed"]), str(r["skipped"]))
    if r["failed"] or r["skipped"]:
        print((out / f"{b}.log").read_text()[-6000:])
Console().print(table)
sys.exit(1 if bad else 0)
PY

passed=$own_passed failed=$own_failed
for b in $backends; do
    read -r p f s < <(python -c 'import json,sys
try: r=json.load(open(sys.argv[1])); print(r["passed"], r["failed"], r["skipped"])
except Exception: print(0, 1, 0)' "$out/$b.json")
    passed=$((passed + p)); failed=$((failed + f + s))
done
echo "tests: $passed passed, $failed failed"
[ "$failed" = 0 ] || status=1
exit $status
