#!/usr/bin/env bash
# Starts the servers the tests need and prints the environment that points
# the tests at them, as lines of "export NAME=value" for eval:
#
#   eval "$(scripts/services.sh)"
#
# Servers already named by EFFECTIVELY_TEST_POSTGRES_URL or
# EFFECTIVELY_TEST_AMQP_URL are used as they are; RabbitMQ is installed from
# Debian's packages when it is absent. Under CI=true a server that cannot be started fails the run; elsewhere
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

start_rabbitmq() {
  if [ -n "${EFFECTIVELY_TEST_AMQP_URL:-}" ]; then
    echo "export EFFECTIVELY_TEST_AMQP_URL='${EFFECTIVELY_TEST_AMQP_URL}'"
    return
  fi
  if ! command -v rabbitmq-server >/dev/null 2>&1; then
    log "installing RabbitMQ"
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q rabbitmq-server; } >&2 \
      || { fail "could not install rabbitmq-server"; return; }
  fi
  # The package's own node (rabbit@<host>, ports 5672 and 25672); the
  # restart tests run nodes of their own beside it.
  if ! rabbitmqctl -q status >/dev/null 2>&1; then
    log "starting RabbitMQ"
    # The service is not started by the package where policy-rc.d denies
    # it: start the node detached, as the rabbitmq user (rabbitmq-server
    # switches to it when run as root).
    rabbitmq-server -detached >&2 || { fail "could not start RabbitMQ"; return; }
  fi
  for _ in $(seq 1 120); do
    rabbitmqctl -q status >/dev/null 2>&1 && break
    sleep 0.5
  done
  rabbitmqctl -q status >/dev/null 2>&1 || { fail "RabbitMQ does not answer (rabbitmqctl status)"; return; }
  # The node answers before its AMQP listener is up.
  for _ in $(seq 1 60); do
    (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null && break
    sleep 0.5
  done
  (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null || { fail "RabbitMQ does not listen on 127.0.0.1:5672"; return; }
  # guest may log in over loopback, which is where the tests connect.
  echo "export EFFECTIVELY_TEST_AMQP_URL='amqp://guest:guest@127.0.0.1:5672/'"
}

start_postgres
start_rabbitmq
