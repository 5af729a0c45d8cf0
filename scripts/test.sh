#!/usr/bin/env bash
# Set-up and the whole test suite with every real server:
#   1. lint and types; the documentation site built with `mkdocs build --strict` (no broken link);
#   2. the conformance suite (every section, faults included) on SQLite,
#      PostgreSQL, MariaDB, ZooKeeper, etcd, Kafka and Redis (the consensus-redis
#      plugin, installed from backends/consensus-redis): one process per backend, each
#      with its own real server, in parallel; then the `security` section and
#      the storage, session and errors sections on the secured servers
#      (entries NAME:secure, `consensus servers run NAME --secure`); then the
#      whole suite on a 3-node ZooKeeper ensemble and a 3-member etcd cluster,
#      and the faults section on a 3-node Kafka cluster (KRaft), whose faults
#      section adds the cluster tests (entries NAME:cluster,
#      `consensus servers run NAME --nodes 3`);
#   3. the project's own tests (two pytest-xdist workers) beside tooz's own
#      suite through our tooz driver on every plain backend;
#   4. chaos runs with faults on every backend (and with leader faults on the
#      clusters), and one run of the locks workload, whose histories one Spark
#      job then checks for linearizability, election, membership, listener and
#      lock safety; beside them, in the background, the "wheels" phase
#      (scripts/wheels.sh): the products built as wheels, each installed into a
#      clean venv with only its documented extras, and checked as a user runs them.
# A conformance or own test that fails runs once more, alone: if it then passes it is
# named as flaky (and counted as passed), else it fails the run.
# Ends with one line "tests: N passed, N failed".
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
bash scripts/venv.sh || exit 2
bash scripts/install.sh || exit 2   # `consensus servers install`, from the venv
export PATH="$ROOT/.venv/bin:$PATH"
out=$(mktemp -d "${TMPDIR:-/tmp}/consensus-test.XXXXXX")
backends=${CONSENSUS_BACKENDS:-sqlite postgresql mariadb zookeeper etcd kafka redis postgresql:secure zookeeper:secure etcd:secure kafka:secure redis:secure zookeeper:cluster etcd:cluster kafka:cluster}
# On secured servers: the security section plus the contract's core over TLS with auth (the whole suite
# passes there too; `consensus servers run NAME --secure -- consensus conformance '$CONSENSUS_URL'`).
secure_select=${CONSENSUS_SECURE_SELECT:-test_security or test_storage or test_session or test_errors}
# On the 3-node Kafka cluster: the faults section only (cluster tests included); the other sections run
# on the single node, and three more JVMs beside the other clusters' whole suites are what two cores allow.
kafka_cluster_select=${CONSENSUS_KAFKA_CLUSTER_SELECT:-test_faults}
plain=$(for b in $backends; do [ "${b%%:*}" = "$b" ] && printf '%s ' "$b"; done)   # tooz and chaos run there
clusters=$(for b in $backends; do [ "${b%:cluster}" = "$b" ] || printf '%s ' "$b"; done)   # and chaos here
chaos_seconds=${CONSENSUS_CHAOS_SECONDS:-30}
# the locks workload runs once, on this backend (the first plain one if it is not in the list)
locks=${CONSENSUS_LOCKS_BACKEND:-etcd}
case " $plain " in *" $locks "*) ;; *) locks=${plain%% *} ;; esac
locks_seconds=${CONSENSUS_LOCKS_SECONDS:-20}
status=0
started=$SECONDS
phase() { echo "== $* (at $((SECONDS - started)) s)"; }

phase "lint and types"
ruff check . || status=1
ruff format --check . || status=1
mypy || status=1

phase "docs"   # the site (mkdocs.yml) builds with no broken link or anchor: one check in the results
docs_started=$SECONDS
NO_MKDOCS_2_WARNING=1 mkdocs build --strict --site-dir "$out/site" >"$out/docs.log" 2>&1
echo $? >"$out/docs.rc"
echo "docs: mkdocs build --strict exit $(cat "$out/docs.rc") in $((SECONDS - docs_started)) s"

conform() {  # one conformance run in the background: entry [selection [suffix of its output files]]
    local entry=$1 b=${1%%:*} select="not test_security" suffix=${3:-}   # security needs a secured server
    local run=(consensus servers run "$b" --)
    case ${entry#"$b"} in
        :secure) run=(consensus servers run "$b" --secure --); select=$secure_select ;;
        :cluster) run=(consensus servers run "$b" --nodes 3 --)   # 3 nodes (ZooKeeper: 128 MiB heap each)
            [ "$b" = kafka ] && select=$kafka_cluster_select ;;   # Kafka: 384 MiB each, faults only
    esac
    [ -n "${2:-}" ] && select=$2
    # the faults section's measured timings go to $out/<entry>-timings.json (docs/guarantees.md)
    CONSENSUS_TIMINGS="$out/$entry$suffix-timings.json" "${run[@]}" consensus conformance '$CONSENSUS_URL' \
        --json -k "$select" >"$out/$entry$suffix.json" 2>"$out/$entry$suffix.log" &
}
# A test that failed runs once more, alone, on a fresh server (<entry>.rerun.*): the results name it
# "flaky" if it then passes, and count it failed if it fails again (docs/decisions.md, "CI: one rerun").
# A run that ended without its summary (its server did not start, or the process died) runs once more whole.
rerun_failed() {  # the entries of the wave that just ended
    local entry names
    for entry in "$@"; do
        if [ ! -s "$out/$entry.json" ]; then
            echo "rerun on $entry: the whole run, which ended without a summary" && conform "$entry" "" .rerun
            continue
        fi
        names=$(sed -n 's/^\(FAILED\|ERROR\) [^:]*::\([A-Za-z0-9_]*\).*/\2/p' "$out/$entry.log" | sort -u |
            paste -sd ' ' | sed 's/ / or /g')
        [ -n "$names" ] && echo "rerun on $entry: $names" && conform "$entry" "$names" .rerun
    done
    wait
}
wave() {  # one wave of conformance runs in parallel, then each one's failed tests once more
    for entry in "$@"; do conform "$entry"; done
    wait
    rerun_failed "$@"
}
secured=$(for b in $backends; do [ "${b%:secure}" = "$b" ] || printf '%s ' "$b"; done)

# three waves, so that the fault tests' timing runs beside at most seven suites on two cores
phase "conformance on: $plain (parallel)"
wave $plain
phase "conformance on: ${secured:-no secured server} (parallel)"
wave $secured
phase "conformance on: ${clusters:-no cluster} (parallel)"
wave $clusters

# the own tests (two pytest-xdist workers, a file each at a time) beside tooz's suite: all three mostly wait
phase "own tests (2 workers) beside tooz's own suite, unmodified, through our tooz driver on: $plain"
pytest -q -p no:cacheprovider -n 2 --dist loadfile --junitxml="$out/own.xml" tests >"$out/own.log" 2>&1 &
for b in $plain; do
    consensus servers run "$b" -- bash -c "TOOZ_TEST_URL='consensus+'\"\$CONSENSUS_URL\" \
        pytest -q -p no:cacheprovider --junitxml='$out/tooz-$b.xml' --pyargs tooz.tests.test_coordination" \
        >"$out/tooz-$b.log" 2>&1
done
wait
failed_own=$(python - "$out/own.xml" <<'PY'
import sys, xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except (OSError, ET.ParseError):
    sys.exit(0)
for case in root.iter("testcase"):
    if case.find("failure") is not None or case.find("error") is not None:
        module, _, klass = case.get("classname", "").partition(".Test")
        path = module.replace(".", "/") + ".py"
        print(f"{path}::Test{klass}::{case.get('name')}" if klass else f"{path}::{case.get('name')}")
PY
)
if [ -n "$failed_own" ]; then
    mapfile -t failed_nodes <<<"$failed_own"
    echo "rerun of the own tests that failed: ${failed_nodes[*]}"
    pytest -q -p no:cacheprovider --junitxml="$out/own.rerun.xml" "${failed_nodes[@]}" >"$out/own.rerun.log" 2>&1
fi

phase "wheels (in the background, beside the chaos runs): consensus-api and consensus-redis from wheels in clean venvs"
bash scripts/wheels.sh "$out/wheels" >"$out/wheels.log" 2>&1 &
wheels=$!
phase "${chaos_seconds} s chaos runs on: $plain $clusters, ${locks_seconds} s of locks on $locks, then one Spark check of every history"
faults_on() {  # the nemesis's faults for a backend
    if [ "$1" = sqlite ]; then echo kill,pause,expire; else echo kill,pause,restart,expire; fi   # no server process to restart
}
for b in $plain; do
    consensus chaos --server "$b" --duration "$chaos_seconds" --clients 5 --keys 2 \
        --faults "$(faults_on "$b")" --out "$out/chaos" >>"$out/chaos.log" 2>&1 ||
        echo "chaos on $b failed" >>"$out/chaos.log"
done
for b in $clusters; do   # NAME:cluster entries: leader kill and pause, a follower partitioned, on 3 nodes
    consensus chaos --server "${b%%:*}" --nodes 3 --duration "$chaos_seconds" --clients 5 --keys 2 \
        --faults leader-kill,leader-pause,partition,kill,pause --out "$out/chaos" >>"$out/chaos.log" 2>&1 ||
        echo "chaos on $b failed" >>"$out/chaos.log"
done
if [ -n "$locks" ]; then
    consensus chaos --server "$locks" --workload locks --duration "$locks_seconds" --clients 4 \
        --faults "$(faults_on "$locks")" --out "$out/chaos" >>"$out/chaos.log" 2>&1 ||
        echo "chaos on $locks (locks) failed" >>"$out/chaos.log"
fi
consensus check "$out/chaos" --master 'local[2]' --report "$out/chaos-report.html" --json \
    >"$out/check.json" 2>>"$out/chaos.log"
echo $? >"$out/check.rc"
wait "$wheels"
phase "$(tail -n 1 "$out/wheels.log")"

phase "results"
python - "$out" $backends <<'PY' || status=1
import json, pathlib, sys, xml.etree.ElementTree as ET
from rich.console import Console
from rich.table import Table
from consensus_api.config import BackendURL
from consensus_testkit.profile import profile_for

out, backends = pathlib.Path(sys.argv[1]), sys.argv[2:]
console = Console(width=120)
passed = failed = 0
flaky: list[str] = []  # failed once, then passed on their rerun
digest: list[str] = []  # the logs whose last lines end the output: why something failed

def tail(name: str, size: int = 8000) -> None:
    path = out / name
    if path.exists():
        console.print(f"--- {name}", markup=False)
        console.print(path.read_text(errors="replace")[-size:], markup=False, highlight=False)

def report(name: str) -> dict:
    try:
        return json.loads((out / name).read_text())
    except (OSError, ValueError):
        return {"passed": 0, "failed": 1, "skipped": 0, "not_applicable": [], "sections": {}}

def rerun_names(log: str) -> list[str]:
    return sorted({line.split("::")[1].split()[0] for line in (out / log).read_text(errors="replace").splitlines()
                   if line.startswith(("FAILED ", "ERROR ")) and "::" in line})

table = Table(title="conformance")
for column in ("backend", "passed", "failed", "skipped", "n/a", "flaky"):
    table.add_column(column)
for b in backends:
    r = report(f"{b}.json")
    again = report(f"{b}.rerun.json") if (out / f"{b}.rerun.json").exists() else None
    if again is not None:
        tail(f"{b}.log")  # the first failures, whatever the rerun gives
        clean = not again["failed"] and not again["skipped"]
        if not (out / f"{b}.json").stat().st_size and again["passed"] and clean:  # a whole run once more
            flaky.append(f"{b}: the whole run, which first ended without a summary")
            digest.append(f"{b}.log")
            r = {**again, "flaky": 1}
        elif r["passed"] and again["passed"] >= r["failed"] and clean:
            flaky += [f"{b}: {name}" for name in rerun_names(f"{b}.log")]
            r = {**r, "passed": r["passed"] + r["failed"], "failed": 0, "flaky": r["failed"]}
        else:
            tail(f"{b}.rerun.log")
    # "not applicable" only for what the backend's test profile declares; anything else fails CI
    declared = set(profile_for(BackendURL(b.partition(":")[0], (), "/")).not_applicable.values())
    undeclared = [n for n in r["not_applicable"] if n["reason"] not in declared]
    for n in undeclared:
        console.print(f"{b}: {n['test']} not applicable, undeclared: {n['reason']}", markup=False)
    bad = r["failed"] or r["skipped"] or not r["passed"] or undeclared
    passed += r["passed"]
    failed += r["failed"] + r["skipped"] + len(undeclared) + (0 if r["passed"] else 1)
    table.add_row(b, str(r["passed"]), str(r["failed"]), str(r["skipped"]), str(len(r["not_applicable"])),
                  str(r.get("flaky", 0)))
    if bad and again is None:
        tail(f"{b}.log")
    if bad:
        digest.append(f"{b}.log" if again is None else f"{b}.rerun.log")
console.print(table)

def junit(name: str) -> tuple[int, int, int]:
    """(tests, failed, skipped) of a junit file; a missing or broken one is one failure."""
    try:
        root = ET.parse(out / name).getroot()
        suite = root if root.tag == "testsuite" else root.find("testsuite")
        tests, failures, errors, skipped = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
    except (OSError, ET.ParseError, AttributeError):
        return 1, 1, 0
    return tests, failures + errors, skipped

tests, own_failed, own_skipped = junit("own.xml")
if own_failed and (out / "own.rerun.xml").exists():
    again, again_failed, again_skipped = junit("own.rerun.xml")
    if again >= own_failed and not again_failed and not again_skipped:
        flaky += [f"own: {name}" for name in rerun_names("own.log")]
        own_failed = 0
        tail("own.log", 20000)  # the first failures
    else:
        tail("own.rerun.log")
own_bad = own_failed + own_skipped
passed += tests - own_bad
failed += own_bad
console.print(f"own tests: {tests - own_bad} passed, {own_bad} failed or skipped")
if own_bad:
    tail("own.log", 20000)
    digest.append("own.rerun.log" if (out / "own.rerun.log").exists() else "own.log")

# tooz's suite skips by itself what it does not test on a driver (e.g. a test it runs only for its own
# etcd3gw, memcached and Redis drivers): its skips are reported, its failures fail CI
tooz = Table(title="tooz's own suite through consensus+<url>")
for column in ("backend", "passed", "failed", "skipped by tooz"):
    tooz.add_column(column)
for b in (b for b in backends if ":" not in b):
    tests, bad, skipped = junit(f"tooz-{b}.xml")
    passed += tests - bad - skipped
    failed += bad + (0 if tests else 1)
    tooz.add_row(b, str(tests - bad - skipped), str(bad), str(skipped))
    if bad or not tests:
        tail(f"tooz-{b}.log")
        digest.append(f"tooz-{b}.log")
console.print(tooz)

check_rc = (out / "check.rc").read_text().strip() if (out / "check.rc").exists() else "missing"
chaos_log = (out / "chaos.log").read_text(errors="replace") if (out / "chaos.log").exists() else ""
runs_failed = [line for line in chaos_log.splitlines() if line.startswith("chaos on ")]
try:
    verdict = json.loads((out / "check.json").read_text())
    summary = {name: check["verdict"] for name, check in verdict["checks"].items()}
    console.print(f"chaos check ({verdict['engine']}, {verdict['seconds']} s): {summary}", markup=False)
    console.print(f"runs: {verdict['runs']}; findings: {verdict['findings'][:5]}", markup=False)
except (OSError, ValueError, KeyError, TypeError):
    console.print("chaos check: no verdict")
if check_rc == "0" and not runs_failed:
    passed += 1
else:
    failed += 1
    tail("chaos.log")
    digest.append("chaos.log")
console.print(f"chaos runs failed: {runs_failed or 'none'}; Spark check exit {check_rc}", markup=False)
console.print(f"chaos report (timelines, faults, findings): {out / 'chaos-report.html'}", markup=False)

# the docs phase: `mkdocs build --strict`, one check
docs_rc = (out / "docs.rc").read_text().strip() if (out / "docs.rc").exists() else "missing"
if docs_rc == "0":
    passed += 1
else:
    failed += 1
    tail("docs.log")
    digest.append("docs.log")
console.print(f"docs: mkdocs build --strict exit {docs_rc}; the site: {out / 'site'}", markup=False)

# the wheels phase: one line per check in wheels/results ("ok NAME", "flaky NAME", "failed NAME")
results = out / "wheels" / "results"
outcomes = [line.split(" ", 1) for line in (results.read_text().splitlines() if results.exists() else [])]
wheels_failed = [name for outcome, name in outcomes if outcome not in ("ok", "flaky")]
flaky += [f"wheels: {name}" for outcome, name in outcomes if outcome == "flaky"]
passed += len(outcomes) - len(wheels_failed)
failed += len(wheels_failed) + (0 if outcomes else 1)
console.print(f"wheels: {len(outcomes) - len(wheels_failed)} checks passed; failed: {wheels_failed or 'none'}",
              markup=False)
for name in wheels_failed or ([] if outcomes else ["no result"]):
    log = f"wheels/{name}.log" if (out / "wheels" / f"{name}.log").exists() else "wheels.log"
    tail(log)
    digest.append(log)

for name in digest:  # again, briefly, at the end, where a reader of the output's last lines sees it
    tail(name, 1500)
console.print(f"flaky (failed once, passed on the rerun): {flaky or 'none'}", markup=False)
print(f"tests: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
PY
phase "done"
exit $status
