#!/usr/bin/env bash
# A throwaway PostgreSQL server for the class store's tests (labs/classroom), from Debian's packages.
# Usage: eval "$(.ci/postgres.sh)"   -> exports ROOFLINE_TEST_PG=postgresql://...; the server runs until the
# machine stops (its data lives in a temporary folder). Prints nothing on stdout when it cannot start one.
set -uo pipefail
PORT="${ROOFLINE_TEST_PG_PORT:-55432}"
say() { echo "postgres.sh: $*" >&2; }
bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
if [ -z "$bindir" ] && command -v apt-get >/dev/null 2>&1; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo -n"
  $sudo apt-get update -q >/dev/null 2>&1 || true
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends postgresql >/dev/null 2>&1 \
    || say "could not install Debian's postgresql package"
  bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
fi
[ -n "$bindir" ] || { say "no PostgreSQL server binaries"; exit 0; }
url="postgresql://roofline@127.0.0.1:$PORT/roofline_test"
if "$bindir/pg_isready" -q -h 127.0.0.1 -p "$PORT"; then echo "export ROOFLINE_TEST_PG=$url"; exit 0; fi
data=$(mktemp -d /tmp/roofline-pg.XXXXXX)
run=()
if [ "$(id -u)" -eq 0 ]; then  # the server refuses to run as root: run it as Debian's postgres user
  chown postgres "$data"; run=(runuser -u postgres --)
fi
"${run[@]}" "$bindir/initdb" -D "$data/db" -U roofline --auth=trust -E UTF8 >"$data/initdb.log" 2>&1 \
  || { say "initdb failed: $(tail -3 "$data/initdb.log")"; exit 0; }
"${run[@]}" "$bindir/pg_ctl" -D "$data/db" -l "$data/server.log" -w -t 60 \
  -o "-p $PORT -k $data -c listen_addresses=127.0.0.1 -c fsync=on" start >/dev/null 2>&1 \
  || { say "the server did not start: $(tail -3 "$data/server.log")"; exit 0; }
"${run[@]}" "$bindir/createdb" -h 127.0.0.1 -p "$PORT" -U roofline roofline_test \
  || { say "createdb failed"; exit 0; }
say "PostgreSQL $("$bindir/postgres" --version | awk '{print $3}') on 127.0.0.1:$PORT (data in $data)"
echo "export ROOFLINE_TEST_PG=$url"
