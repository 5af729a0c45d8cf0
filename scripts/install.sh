#!/usr/bin/env bash
# Installs what consensus_testkit needs to run real servers: Debian's
# ZooKeeper, PostgreSQL, MariaDB and Redis (the consensus-redis plugin's
# launcher), a Java 17+ runtime, Maven, etcd and etcdctl built with Go from the
# Go module proxy, and the Kafka broker jars from Maven Central (both into a
# cache dir). Idempotent: when everything is there it only checks and exits.
# Does not touch the Python venv.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
POM="$ROOT/backends/consensus_backends/kafka/testkit/kafka-pom.xml"
CACHE="${CONSENSUS_CACHE:-$HOME/.cache/consensus-api}"

say() { echo "install: $*"; }

java_major() {
    # Prints the major version of `java` on PATH, or 0 when there is none.
    command -v java >/dev/null || { echo 0; return; }
    java -XshowSettings:properties -version 2>&1 \
        | sed -n 's/^ *java\.specification\.version = \([0-9]*\).*/\1/p' | head -n1
}

pg_installed() {
    compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null || command -v postgres >/dev/null
}

# ---- Debian packages -------------------------------------------------------
missing=()
[ -f /usr/share/java/zookeeper.jar ] || missing+=(zookeeper)
pg_installed || missing+=(postgresql)
command -v mariadbd >/dev/null || [ -x /usr/sbin/mariadbd ] || missing+=(mariadb-server)
[ "$(java_major)" -ge 17 ] || missing+=(java)
command -v mvn >/dev/null || missing+=(maven)
command -v redis-server >/dev/null || [ -x /usr/bin/redis-server ] || missing+=(redis-server)

if [ ${#missing[@]} -gt 0 ]; then
    [ "$(id -u)" -eq 0 ] || { say "missing ${missing[*]}; run this script as root"; exit 1; }
    say "apt-get update (missing: ${missing[*]})"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    pkgs=()
    for m in "${missing[@]}"; do
        case $m in
            postgresql)
                # Prefer 15 (what the project is tested with); fall back to the distro's default.
                if apt-cache show postgresql-15 >/dev/null 2>&1; then pkgs+=(postgresql-15); else pkgs+=(postgresql); fi ;;
            java)
                if apt-cache show openjdk-17-jre-headless >/dev/null 2>&1; then pkgs+=(openjdk-17-jre-headless)
                else pkgs+=(default-jre-headless); fi ;;
            *) pkgs+=("$m") ;;
        esac
    done
    say "apt-get install ${pkgs[*]}"
    apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
fi
say "debian packages ok (zookeeper, postgresql, mariadb, redis, java $(java_major), maven)"

# ---- etcd and etcdctl, built from the Go module proxy -------------------------
# `go install go.etcd.io/etcd/server/v3@v…` is refused (replace directives in its go.mod),
# so both are built as dependencies of a throwaway module. Go's caches live in $CACHE/go.
ETCD_VERSION=$(sed -n 's/^ETCD_VERSION = "\(.*\)"$/\1/p' "$ROOT/backends/consensus_backends/etcd/testkit/server.py")
[ -n "$ETCD_VERSION" ] || { say "no ETCD_VERSION in backends/consensus_backends/etcd/testkit/server.py"; exit 1; }
etcd_dir="$CACHE/etcd-$ETCD_VERSION"

etcd_ok() {  # output captured first: `cmd | grep -q` fails under pipefail when grep exits early (SIGPIPE)
    local server client
    server=$("$etcd_dir/etcd" --version 2>/dev/null) && client=$("$etcd_dir/etcdctl" version 2>/dev/null) &&
        grep -qx "etcd Version: $ETCD_VERSION" <<<"$server" && grep -qx "etcdctl version: $ETCD_VERSION" <<<"$client"
}

if etcd_ok; then
    say "etcd $ETCD_VERSION ok ($etcd_dir)"
else
    go=$(command -v go || true)
    [ -n "$go" ] || { [ -x /usr/local/go/bin/go ] && go=/usr/local/go/bin/go; }
    [ -n "$go" ] || { say "building etcd $ETCD_VERSION needs Go (not on PATH nor in /usr/local/go/bin)"; exit 1; }
    say "building etcd $ETCD_VERSION with $("$go" version) into $etcd_dir (first time: about 2 minutes)"
    mkdir -p "$CACHE/go"
    build=$(mktemp -d "$CACHE/go/etcd-build.XXXXXX")
    trap 'rm -rf "$build"' EXIT
    if ! (
        cd "$build"
        export GOPATH="$CACHE/go" GOMODCACHE="$CACHE/go/mod" GOCACHE="$CACHE/go/build" \
            GOFLAGS=-modcacherw CGO_ENABLED=0
        "$go" mod init etcdbuild &&
            "$go" get "go.etcd.io/etcd/server/v3@v$ETCD_VERSION" "go.etcd.io/etcd/etcdctl/v3@v$ETCD_VERSION" &&
            mkdir bin &&
            "$go" build -o bin/etcd go.etcd.io/etcd/server/v3 &&
            "$go" build -o bin/etcdctl go.etcd.io/etcd/etcdctl/v3
    ) >"$build/go.log" 2>&1; then
        tail -n 40 "$build/go.log"
        say "go failed to build etcd $ETCD_VERSION"
        exit 1
    fi
    rm -rf "$etcd_dir"
    mv "$build/bin" "$etcd_dir"
    rm -rf "$build"
    trap - EXIT
    etcd_ok || { say "the built etcd does not report version $ETCD_VERSION"; exit 1; }
    say "etcd $ETCD_VERSION built ($etcd_dir)"
fi

# ---- Kafka jars ------------------------------------------------------------
version=$(sed -n 's:.*<kafka\.version>\(.*\)</kafka\.version>.*:\1:p' "$POM")
[ -n "$version" ] || { say "no <kafka.version> in $POM"; exit 1; }
libs="$CACHE/kafka-$version/libs"
marker="$libs/.complete"
pom_sum=$(sha256sum "$POM" | cut -d' ' -f1)

if [ -f "$marker" ] && [ "$(cat "$marker")" = "$pom_sum" ]; then
    say "kafka $version jars ok ($libs)"
    exit 0
fi

say "fetching kafka $version jars into $libs (first time: about a minute)"
mkdir -p "$CACHE/kafka-$version"
tmp=$(mktemp -d "$CACHE/kafka-$version/libs.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
if ! mvn -q -B -f "$POM" dependency:copy-dependencies -DoutputDirectory="$tmp" -DincludeScope=runtime \
        >"$tmp/mvn.log" 2>&1; then
    tail -n 40 "$tmp/mvn.log"
    say "maven failed to fetch the kafka jars"
    exit 1
fi
rm -f "$tmp/mvn.log"
[ -n "$(compgen -G "$tmp/kafka_2.13-$version.jar")" ] || { say "kafka_2.13-$version.jar was not fetched"; exit 1; }
echo "$pom_sum" >"$tmp/.complete"
rm -rf "$libs"
mv "$tmp" "$libs"
trap - EXIT
say "kafka $version: $(find "$libs" -name '*.jar' | wc -l) jars in $libs"
