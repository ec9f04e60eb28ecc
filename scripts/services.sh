#!/usr/bin/env bash
# Starts the servers the tests need and prints the environment that points
# the tests at them, as lines of "export NAME=value" for eval:
#
#   eval "$(scripts/services.sh)"
#
# Servers already named by EFFECTIVELY_TEST_POSTGRES_URL are used as they
# are. Under CI=true a server that cannot be started fails the run; elsewhere
# the tests that need it are skipped.
set -euo pipefail

log() { printf 'services: %s\n' "$*" >&2; }
fail() {
  log "$*"
  if [ "${CI:-}" = "true" ]; then exit 1; fi
}

as_postgres() { runuser -u postgres -- "$@"; }

start_postgres() {
  if [ -n "${EFFECTIVELY_TEST_POSTGRES_URL:-}" ]; then
    echo "export EFFECTIVELY_TEST_POSTGRES_URL='${EFFECTIVELY_TEST_POSTGRES_URL}'"
    return
  fi
  if ! command -v pg_ctlcluster >/dev/null 2>&1; then
    fail "PostgreSQL 15 is not installed (pg_ctlcluster not found)"; return
  fi
  if ! pg_lsclusters -h 2>/dev/null | awk '$1 == 15 && $2 == "main" && $4 == "online"' | grep -q .; then
    log "starting PostgreSQL 15"
    pg_ctlcluster --skip-systemctl-redirect 15 main start >&2 || { fail "could not start PostgreSQL 15"; return; }
  fi
  for _ in $(seq 1 50); do
    pg_isready -q -h 127.0.0.1 -p 5432 && break
    sleep 0.2
  done
  pg_isready -q -h 127.0.0.1 -p 5432 || { fail "PostgreSQL does not answer on 127.0.0.1:5432"; return; }
  # A role of the tests' own with a password, over TCP on loopback; the
  # server's configuration stays as it is.
  as_postgres psql -q -v ON_ERROR_STOP=1 -d postgres >&2 <<'SQL' || { fail "could not create the test role"; return; }
SELECT 'CREATE ROLE effectively_test LOGIN PASSWORD ''effectively_test'''
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'effectively_test')\gexec
SELECT 'CREATE DATABASE effectively_test OWNER effectively_test'
WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'effectively_test')\gexec
SQL
  echo "export EFFECTIVELY_TEST_POSTGRES_URL='postgres://effectively_test:effectively_test@127.0.0.1:5432/effectively_test?sslmode=disable'"
}

start_postgres
