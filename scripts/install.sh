#!/usr/bin/env bash
# Installs what CI's real servers need, the way a user does (`consensus servers
# install NAME`, from the test kit): Debian's PostgreSQL, MariaDB, ZooKeeper and
# Redis (the consensus-redis plugin's launcher), a Java 17+ runtime and Maven
# (apt-get, as root), the Kafka broker jars fetched with Maven and etcd and
# etcdctl built with Go (both into $CONSENSUS_CACHE or ~/.cache/consensus-api);
# then Debian's chromium and chromedriver for the own tests. Idempotent: when
# everything is there it only checks. Needs the project venv (scripts/venv.sh,
# which it runs when .venv has no `consensus`).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
say() { echo "install: $*"; }

[ -x "$ROOT/.venv/bin/consensus" ] || bash "$ROOT/scripts/venv.sh"
yes=()
[ "$(id -u)" -eq 0 ] && yes=(--yes)   # as root apt-get runs; otherwise its line is printed (exit 2)
"$ROOT/.venv/bin/consensus" servers install "${yes[@]}" postgresql mariadb zookeeper etcd kafka redis

# ---- chromium and its chromedriver (Debian's): tests/test_chaos_report.py opens a chaos report ----
browser=()
command -v chromium >/dev/null || browser+=(chromium)
command -v chromedriver >/dev/null || browser+=(chromium-driver)
if [ ${#browser[@]} -gt 0 ]; then
    [ "$(id -u)" -eq 0 ] || { say "missing ${browser[*]}; run this script as root"; exit 1; }
    say "apt-get install ${browser[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
fi
say "chromium ok ($(chromium --version 2>/dev/null | head -n1))"
