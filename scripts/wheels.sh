#!/usr/bin/env bash
# The products as a user gets them (CI's "wheels" phase): wheels of consensus-api (built from its
# sdist) and consensus-redis, each installed into a clean venv outside the checkout with only its
# documented extras:
#   runtime only: the runtime imports (with aio, migrate and a connect) without pytest, psutil or
#     pyarrow, also beside consensus-redis; `consensus kv put/get` on SQLite; `consensus conformance`
#     is one line naming [conformance], exit 2;
#   [sql,conformance]: `consensus conformance sqlite:///… --json` with 0 failed and 0 skipped; the
#     README's pytest line (taken from README.md, on a fresh database) passes; `consensus servers run
#     postgresql -- true` without psycopg is one line, exit 2; consensus-redis[conformance] finds its
#     server (`consensus servers install redis`);
#   [sql,chaos]: a 5 s chaos run on SQLite and `consensus check --engine local` pass.
# A conformance test that fails runs once more, alone (as in scripts/test.sh): passing then, it is
# named flaky. Usage: scripts/wheels.sh OUT (a directory: wheels, venvs, logs). Writes one line per
# check to OUT/results ("ok NAME", "flaky NAME", "failed NAME"; its output in OUT/NAME.log) and prints
# them; exit 1 if one failed.
# Python packages come from PyPI once, then from the wheelhouse $CONSENSUS_CACHE/pip/wheels
# (default ~/.cache/consensus-api).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=$(mkdir -p "$1" && cd "$1" && pwd)
cache="${CONSENSUS_CACHE:-$HOME/.cache/consensus-api}/pip"
wheelhouse="$cache/wheels"
dist="$out/dist"
started=$SECONDS
python=${PYTHON:-python3}
: >"$out/results"

result() {  # outcome name
    echo "$1 $2" >>"$out/results"
    echo "wheels: $1 $2"
}
check() {  # name command...: ok when the command succeeds (its output in OUT/<name>.log)
    local name=$1
    shift
    if "$@" >"$out/$name.log" 2>&1; then result ok "$name"; else result failed "$name"; fi
}
one_line_exit_2() {  # expected-text command...: the command prints exactly one line naming it, exit 2
    local expected=$1 output status
    shift
    output=$("$@" 2>&1)
    status=$?
    echo "$output"
    echo "exit $status"
    [ "$status" -eq 2 ] && [ "$(wc -l <<<"$output")" -eq 1 ] && grep -qF -- "$expected" <<<"$output"
}
venv() {  # name requirement...: a clean venv with the requirements from the built wheels and the wheelhouse
    local dir="$out/venv-$1"
    shift
    "$python" -m venv "$dir" || return 1
    local from=(--disable-pip-version-check -q --find-links "$dist" --find-links "$wheelhouse")
    "$dir/bin/pip" install "${from[@]}" --no-index "$@" 2>/dev/null && return 0
    # a miss: fill the wheelhouse from PyPI (the built wheels stay out of it), then install from it
    mkdir -p "$wheelhouse"
    "$dir/bin/pip" wheel "${from[@]}" --cache-dir "$cache" -w "$wheelhouse" "$@" || return 1
    rm -f "$wheelhouse"/consensus_api-* "$wheelhouse"/consensus_redis-*
    "$dir/bin/pip" install "${from[@]}" --no-index "$@"
}
conformance_json() {  # bin summary.json: the summary has 0 failed, 0 skipped and tests that passed
    "$1/python" - "$2" <<'PY'
import json, sys
summary = json.load(open(sys.argv[1]))
print({key: summary[key] for key in ("passed", "failed", "skipped")})
sys.exit(0 if summary["passed"] and not summary["failed"] and not summary["skipped"] else 1)
PY
}

echo "wheels: building consensus-api (sdist, then the wheel from it) and consensus-redis into $dist"
rm -rf "$dist"
if ! "$python" -m build -o "$dist" "$ROOT" >"$out/build.log" 2>&1 ||
    ! "$python" -m build -o "$dist" "$ROOT/backends/consensus-redis" >>"$out/build.log" 2>&1; then
    tail -n 30 "$out/build.log"
    result failed build
    exit 1
fi
api=$(ls "$dist"/consensus_api-*.whl)
redis=$(ls "$dist"/consensus_redis-*.whl)
cd "$out" || exit 1   # outside the checkout: nothing of it is importable from here

# ---- the runtime alone ----
runtime_imports='
import sys
import consensus_api, consensus_api.aio, consensus_api.migrate
import consensus_redis  # a backend of its own distribution, installed beside the runtime
with consensus_api.connect("sqlite:///imports.db") as session:
    session.storage.keys("")
loaded = sorted(m for m in sys.modules if m.startswith(("pytest", "psutil", "pyarrow")))
assert not loaded, f"the runtime imported {loaded}"
'
if venv runtime "$api" "$redis" >"$out/venv-runtime.log" 2>&1; then
    bin="$out/venv-runtime/bin"
    check runtime-imports "$bin/python" -c "$runtime_imports"
    kv_roundtrip() { "$bin/consensus" kv put w/k v --url sqlite:///kv.db && [ "$("$bin/consensus" kv get w/k --url sqlite:///kv.db)" = v ]; }
    check runtime-kv kv_roundtrip
    check runtime-conformance-names-extra one_line_exit_2 "'consensus-api[conformance]'" \
        "$bin/consensus" conformance sqlite:///runtime.db
else
    result failed venv-runtime
fi

# ---- [sql,conformance] ----
conformance_suite() {  # bin: the CLI's run, then its failed tests once more, alone
    local bin=$1 names
    "$bin/consensus" conformance sqlite:///cli.db --json >"$out/conformance.json" 2>"$out/conformance-sqlite.log"
    conformance_json "$bin" "$out/conformance.json" >>"$out/conformance-sqlite.log" && return 0
    names=$(sed -n 's/^\(FAILED\|ERROR\) [^:]*::\([A-Za-z0-9_]*\).*/\2/p' "$out/conformance-sqlite.log" | sort -u |
        paste -sd ' ' | sed 's/ / or /g')
    [ -n "$names" ] || return 1
    echo "rerun: $names" >>"$out/conformance-sqlite.log"
    "$bin/consensus" conformance sqlite:///rerun.db --json -k "$names" >"$out/conformance.rerun.json" \
        2>>"$out/conformance-sqlite.log" || return 1
    conformance_json "$bin" "$out/conformance.rerun.json" >>"$out/conformance-sqlite.log" && return 2
    return 1
}
readme_line=$(grep -m1 '^pytest -p consensus_testkit.conformance ' "$ROOT/README.md" |
    sed "s#--consensus-url=[^ ]*#--consensus-url=sqlite:///$out/readme.db#")
readme_suite() {  # bin: the README's pytest line (its failed tests once more: --lf)
    PATH="$1:$PATH" bash -c "$readme_line" >"$out/readme-pytest-line.log" 2>&1 && return 0
    PATH="$1:$PATH" bash -c "$readme_line --lf" >"$out/readme-pytest-line.rerun.log" 2>&1 && return 2
    return 1
}
outcome() {  # name status: 0 ok, 2 flaky (passed on the rerun), else failed
    case $2 in 0) result ok "$1" ;; 2) result flaky "$1" ;; *) result failed "$1" ;; esac
}
if venv conformance "$api[sql,conformance]" "$redis[conformance]" >"$out/venv-conformance.log" 2>&1; then
    bin="$out/venv-conformance/bin"
    conformance_suite "$bin"
    outcome conformance-sqlite $?
    if [ -n "$readme_line" ]; then
        readme_suite "$bin"
        outcome readme-pytest-line $?
    else
        result failed readme-pytest-line-not-found
    fi
    check servers-run-postgresql-without-psycopg one_line_exit_2 "'consensus-api[postgresql,conformance]'" \
        "$bin/consensus" servers run postgresql -- true
    check servers-install-redis "$bin/consensus" servers install redis
else
    result failed venv-conformance
fi

# ---- [sql,chaos] ----
if venv chaos "$api[sql,chaos]" >"$out/venv-chaos.log" 2>&1; then
    bin="$out/venv-chaos/bin"
    check chaos-sqlite "$bin/consensus" chaos --server sqlite --duration 5 --clients 3 --faults kill,pause \
        --out "$out/chaos"
    check chaos-check-local "$bin/consensus" check "$out/chaos" --engine local
else
    result failed venv-chaos
fi

echo "wheels: $(grep -c '^ok ' "$out/results") ok, $(grep -c '^flaky ' "$out/results") flaky," \
    "$(grep -c '^failed ' "$out/results") failed in $((SECONDS - started)) s"
! grep -q '^failed ' "$out/results"
