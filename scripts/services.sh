#!/usr/bin/env bash
# Starts the servers the tests need and prints the environment that points
# the tests at them, as lines of "export NAME=value" for eval:
#
#   eval "$(scripts/services.sh)"
#
# Servers already named by EFFECTIVELY_TEST_POSTGRES_URL or
# EFFECTIVELY_TEST_AMQP_URL are used as they are; RabbitMQ, the sqlite3
# program and the chromium browser are installed from Debian's packages
# when they are absent. Under CI=true a server that cannot be started (or
# a program installed) fails the run; elsewhere the tests that need it are
# skipped.
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
    # More connections than the default 100, for this start only (the
    # configuration files stay as they are): the test packages run in
    # parallel, each starting services with pools of their own, and the
    # network fault tests run four at once, whose pools grow while a
    # black hole holds their connections (a hundred sessions and more
    # for one test's three instances): at 300, a test beside them could
    # find the server full ("too many clients") and stall until they
    # ended.
    pg_ctlcluster --skip-systemctl-redirect -o "-c max_connections=1000" 15 main start >&2 || { fail "could not start PostgreSQL 15"; return; }
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

# The tests' RabbitMQ is a node of their own, not the package's: node
# effectively-test@localhost on 127.0.0.1:5673 (distribution on 25673), run
# as the rabbitmq user with its data in a folder that user owns. A node left
# running by an earlier run is reused (other runs may be using it);
# otherwise its folder is wiped and it starts empty. (Every run leaves
# durable queues of random names behind, and a node recovering thousands of
# them at boot does not answer for minutes: the package's node, restarted
# on a copy of this machine, never did.)
RABBITMQ_TEST_NODE=effectively-test@localhost
RABBITMQ_TEST_PORT=5673
RABBITMQ_TEST_DIST_PORT=25673
RABBITMQ_TEST_DIR=/var/tmp/effectively-test-rabbitmq
RABBITMQ_BENCH_VHOST=effectively-bench
RABBITMQ_SMOKE_VHOST=effectively-bench-smoke
RABBITMQ_TEST_PLUGINS=rabbitmq_consistent_hash_exchange

as_rabbitmq() {
  runuser -u rabbitmq -- env HOME=/var/lib/rabbitmq \
    RABBITMQ_NODENAME="$RABBITMQ_TEST_NODE" \
    RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
    RABBITMQ_NODE_PORT="$RABBITMQ_TEST_PORT" \
    RABBITMQ_DIST_PORT="$RABBITMQ_TEST_DIST_PORT" \
    RABBITMQ_MNESIA_BASE="$RABBITMQ_TEST_DIR/mnesia" \
    RABBITMQ_LOG_BASE="$RABBITMQ_TEST_DIR/log" \
    RABBITMQ_ENABLED_PLUGINS_FILE="$RABBITMQ_TEST_DIR/enabled_plugins" \
    RABBITMQ_PID_FILE="$RABBITMQ_TEST_DIR/pid" \
    "$@"
}

rabbitmq_answers() { (exec 3<>"/dev/tcp/127.0.0.1/$RABBITMQ_TEST_PORT") 2>/dev/null; }

start_rabbitmq() {
  if [ -n "${EFFECTIVELY_TEST_AMQP_URL:-}" ]; then
    echo "export EFFECTIVELY_TEST_AMQP_URL='${EFFECTIVELY_TEST_AMQP_URL}'"
    if [ -n "${EFFECTIVELY_TEST_AMQP_BENCH_URL:-}" ]; then
      echo "export EFFECTIVELY_TEST_AMQP_BENCH_URL='${EFFECTIVELY_TEST_AMQP_BENCH_URL}'"
    fi
    if [ -n "${EFFECTIVELY_TEST_AMQP_SMOKE_URL:-}" ]; then
      echo "export EFFECTIVELY_TEST_AMQP_SMOKE_URL='${EFFECTIVELY_TEST_AMQP_SMOKE_URL}'"
    fi
    return
  fi
  if ! command -v rabbitmq-server >/dev/null 2>&1; then
    log "installing RabbitMQ"
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q rabbitmq-server; } >&2 \
      || { fail "could not install rabbitmq-server"; return; }
  fi
  # One run at a time decides whether to start the node.
  exec 9>"$RABBITMQ_TEST_DIR.lock"
  flock 9
  if ! as_rabbitmq rabbitmqctl -q -n "$RABBITMQ_TEST_NODE" status >/dev/null 2>&1; then
    log "starting RabbitMQ (node $RABBITMQ_TEST_NODE, port $RABBITMQ_TEST_PORT)"
    rm -rf "$RABBITMQ_TEST_DIR"
    install -d -o rabbitmq -g rabbitmq -m 0755 "$RABBITMQ_TEST_DIR"
    # The node reads its plugins from this file at boot: the
    # consistent-hash exchange of partitioned consumers (the plugin ships
    # with Debian's rabbitmq-server).
    echo "[$RABBITMQ_TEST_PLUGINS]." | install -o rabbitmq -g rabbitmq -m 0644 /dev/stdin "$RABBITMQ_TEST_DIR/enabled_plugins"
    as_rabbitmq rabbitmq-server -detached >&2 9>&- || { fail "could not start RabbitMQ"; return; }
  fi
  # The node answers rabbitmqctl before its AMQP listener is up.
  for _ in $(seq 1 240); do
    rabbitmq_answers && break
    sleep 0.5
  done
  rabbitmq_answers || { fail "RabbitMQ does not listen on 127.0.0.1:$RABBITMQ_TEST_PORT (logs in $RABBITMQ_TEST_DIR/log)"; return; }
  # A node left running by an earlier version of this script may lack the
  # plugin: enabling it on the running node is idempotent (it writes the
  # file above too).
  as_rabbitmq rabbitmq-plugins -q -n "$RABBITMQ_TEST_NODE" enable "$RABBITMQ_TEST_PLUGINS" >&2 \
    || { fail "could not enable $RABBITMQ_TEST_PLUGINS on RabbitMQ"; return; }
  exec 9>&-
  # The benchmark runs the example service, whose queue and exchange names
  # are fixed: a virtual host of its own keeps it apart from the example's
  # tests, which may run at the same time. TestSmoke (make test) runs the
  # benchmark's RabbitMQ scenarios in two lanes at once, the second in a
  # second virtual host.
  local vhosts
  vhosts="$(as_rabbitmq rabbitmqctl -q -n "$RABBITMQ_TEST_NODE" list_vhosts 2>/dev/null)"
  for vhost in "$RABBITMQ_BENCH_VHOST" "$RABBITMQ_SMOKE_VHOST"; do
    if ! grep -qx "$vhost" <<<"$vhosts"; then
      as_rabbitmq rabbitmqctl -q -n "$RABBITMQ_TEST_NODE" add_vhost "$vhost" >&2 2>/dev/null || true
      as_rabbitmq rabbitmqctl -q -n "$RABBITMQ_TEST_NODE" set_permissions -p "$vhost" guest '.*' '.*' '.*' >&2 \
        || { fail "could not create the benchmark's virtual host $vhost"; return; }
    fi
  done
  # guest may log in over loopback, which is where the tests connect.
  echo "export EFFECTIVELY_TEST_AMQP_URL='amqp://guest:guest@127.0.0.1:$RABBITMQ_TEST_PORT/'"
  echo "export EFFECTIVELY_TEST_AMQP_BENCH_URL='amqp://guest:guest@127.0.0.1:$RABBITMQ_TEST_PORT/$RABBITMQ_BENCH_VHOST'"
  echo "export EFFECTIVELY_TEST_AMQP_SMOKE_URL='amqp://guest:guest@127.0.0.1:$RABBITMQ_TEST_PORT/$RABBITMQ_SMOKE_VHOST'"
}

# Debian's sqlite3 program (3.40 on Debian 12, the oldest SQLite the docs
# claim for programs that share the file): a test runs the hand INSERT of
# docs/transports.md through it.
install_sqlite3() {
  if command -v sqlite3 >/dev/null 2>&1; then return; fi
  log "installing sqlite3"
  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q sqlite3; } >&2 \
    || fail "could not install sqlite3"
}

# Debian's chromium: the operator console's browser test drives it
# headless (app's TestConsoleBrowser).
install_chromium() {
  if command -v chromium >/dev/null 2>&1; then return; fi
  log "installing chromium"
  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; } >&2 \
    || fail "could not install chromium"
}

start_postgres
start_rabbitmq
install_sqlite3
install_chromium
