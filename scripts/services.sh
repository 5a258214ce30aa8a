#!/usr/bin/env bash
# Check — and where this machine allows, start — the services the test suite needs:
# PostgreSQL (127.0.0.1:5432, trust auth), Redis (127.0.0.1:6379), RabbitMQ (127.0.0.1:5672),
# and the headless browser the operator console's tests drive (Debian's chromium + chromium-driver).
# A service that cannot be brought up fails the run (exit 1); nothing is ever skipped.
set -uo pipefail
REDIS_PORT="${REDIS_PORT:-6379}"
fail=0
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n "$@"; fi; }
apt_install() {
  command -v apt-get >/dev/null || return 1
  as_root apt-get update -qq >/dev/null 2>&1 || true
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "$@" >/dev/null 2>&1
}

# --- PostgreSQL
if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
  command -v pg_ctlcluster >/dev/null || apt_install postgresql postgresql-client
  PG_VER="$(ls /etc/postgresql 2>/dev/null | sort -n | tail -1)"
  if [ -n "$PG_VER" ]; then
    as_root sed -i -E 's/^(local|host)(\s+.*)\s(peer|scram-sha-256|md5|ident)\s*$/\1\2 trust/' \
      "/etc/postgresql/$PG_VER/main/pg_hba.conf" || true
    as_root pg_ctlcluster --skip-systemctl-redirect "$PG_VER" main start >/dev/null 2>&1 || true
    for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
  fi
fi
if pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
  psql -h 127.0.0.1 -U postgres -tAc "SELECT 1" >/dev/null 2>&1 || { echo "services: PostgreSQL is up but user postgres cannot connect (trust auth needed)"; fail=1; }
  echo "services: PostgreSQL ok"
else
  echo "services: PostgreSQL is NOT reachable on 127.0.0.1:5432"; fail=1
fi

# --- Redis
if ! redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping >/dev/null 2>&1; then
  command -v redis-server >/dev/null || apt_install redis-server
  if command -v redis-server >/dev/null; then
    redis-server --daemonize yes --bind 127.0.0.1 --port "$REDIS_PORT" --save "" --appendonly no >/dev/null 2>&1
    for _ in $(seq 1 50); do redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
  fi
fi
if redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping >/dev/null 2>&1; then
  echo "services: Redis ok"
else
  echo "services: Redis is NOT reachable on 127.0.0.1:$REDIS_PORT"; fail=1
fi

# --- RabbitMQ (the AMQP-broker integration tests)
rabbit_up() { (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null; }
if ! rabbit_up; then
  command -v rabbitmq-server >/dev/null || apt_install rabbitmq-server
  command -v rabbitmq-server >/dev/null && as_root rabbitmq-server -detached >/dev/null 2>&1
  for _ in $(seq 1 60); do rabbit_up && break; sleep 1; done
fi
if rabbit_up; then echo "services: RabbitMQ ok"; else echo "services: RabbitMQ is NOT reachable on 127.0.0.1:5672"; fail=1; fi

# --- Chromium and its driver (the operator console's browser tests; Selenium is pointed at
# /usr/bin/chromedriver, so nothing ever downloads a browser)
browser_ok() { { command -v chromium >/dev/null || command -v chromium-browser >/dev/null; } \
  && [ -x /usr/bin/chromedriver ]; }
browser_ok || apt_install chromium chromium-driver
if browser_ok; then
  echo "services: Chromium ok ($( (chromium --version || chromium-browser --version) 2>/dev/null | head -1))"
else
  echo "services: Chromium and /usr/bin/chromedriver are NOT installed (apt: chromium chromium-driver)"; fail=1
fi

exit $fail
