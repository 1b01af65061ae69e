#!/usr/bin/env bash
# Team mode: an MLflow tracking server backed by PostgreSQL, with a served artifact store, bound to 127.0.0.1.
#   bash scripts/team_server.sh start    # installs PostgreSQL from the distribution if missing (needs root),
#                                        # starts it and the MLflow server, prints the MLFLOW_TRACKING_URI to use
#   bash scripts/team_server.sh stop
# Settings (environment): MLFLOW_PORT (5001), TEAM_DIR (.team: artifacts, logs, pid, db-password),
# AMPBENCH_DB_PASSWORD (overrides the generated one), AMPBENCH_DB_USER and AMPBENCH_DB_NAME (both ampbench).
# The database password is generated on first start and kept in $TEAM_DIR/db-password (mode 0600); it never
# appears on a command line (every local user can read those in `ps`) nor in a log: it reaches psql and the
# MLflow server through their environment only, and psql quotes it itself (\getenv + :'pw'), so no quote in it
# can end the SQL string.
# Remote access: keep the bind on loopback and tunnel (ssh -L 5001:127.0.0.1:5001 host), or put an
# authenticating proxy in front and pass --allowed-hosts; never disable MLflow's security middleware.
set -euo pipefail
cd "$(dirname "$0")/.."
port="${MLFLOW_PORT:-5001}"
db_user="${AMPBENCH_DB_USER:-ampbench}"
db_name="${AMPBENCH_DB_NAME:-ampbench}"
for name in "$db_user" "$db_name"; do  # they go into a URI unquoted: plain SQL names only
  [[ "$name" =~ ^[a-z_][a-z0-9_]*$ ]] || { echo "error: database user/name must match [a-z_][a-z0-9_]*: $name" >&2; exit 2; }
done
dir="$(mkdir -p "${TEAM_DIR:-.team}" && cd "${TEAM_DIR:-.team}" && pwd)"
mlflow_bin="${MLFLOW_BIN:-$PWD/.venv/bin/mlflow}"
password_file="$dir/db-password"

running() { [ -f "$dir/mlflow.pid" ] && kill -0 "$(cat "$dir/mlflow.pid")" 2>/dev/null; }

# The password in use: AMPBENCH_DB_PASSWORD, else the kept one, else a new random one; always kept (0600) so a
# later start without the override finds it. printf is a builtin: the secret is never an argument of a process.
load_password() {
  if [ -n "${AMPBENCH_DB_PASSWORD:-}" ]; then
    password="$AMPBENCH_DB_PASSWORD"
  elif [ -s "$password_file" ]; then
    password="$(<"$password_file")"
  else
    password="$(python3 -c 'import secrets; print(secrets.token_urlsafe(24))')"
  fi
  (umask 077 && printf '%s' "$password" >"$password_file.tmp") && mv -f "$password_file.tmp" "$password_file"
  chmod 600 "$password_file"
}

start_postgres() {
  if ! command -v pg_lsclusters >/dev/null 2>&1; then
    echo "installing PostgreSQL from the distribution's packages"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  fi
  read -r version cluster _ < <(pg_lsclusters -h | head -n 1)
  pg_lsclusters -h | head -n 1 | grep -q online || pg_ctlcluster "$version" "$cluster" start
}

# Create the role and database, or set an existing role's password to the current one (an older or overridden
# one would lock the server out). The SQL comes on stdin and the password from the environment: psql's :'pw'
# quotes it as a literal and :"user" an identifier. A failing statement would be copied into PostgreSQL's log
# with the literal in it, so this session logs none.
setup_role() {
  local major
  major="$(psql --version | sed -E 's/^[^0-9]*([0-9]+).*/\1/')"
  if [ "$major" -lt 15 ]; then echo "error: psql $major found; team mode needs PostgreSQL 15 or later" >&2; exit 1; fi
  AMPBENCH_PSQL_PW="$password" runuser -u postgres -- psql -qX -v ON_ERROR_STOP=1 -v user="$db_user" \
    -v db="$db_name" >/dev/null <<'SQL'
SET log_statement = 'none';
SET log_min_error_statement = 'panic';
\getenv pw AMPBENCH_PSQL_PW
SELECT NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'user') AS new_role \gset
\if :new_role
CREATE ROLE :"user" LOGIN PASSWORD :'pw';
\else
ALTER ROLE :"user" LOGIN PASSWORD :'pw';
\endif
SELECT NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = :'db') AS new_db \gset
\if :new_db
CREATE DATABASE :"db" OWNER :"user";
\endif
SQL
}

start_mlflow() {
  if running; then
    echo "MLflow server already running (pid $(cat "$dir/mlflow.pid"))"
  else
    # The store URI (with the password, percent-encoded) goes in MLFLOW_BACKEND_STORE_URI, which `mlflow server`
    # reads for --backend-store-uri and hands to its workers the same way. SQLAlchemy 2.1 maps plain
    # postgresql:// to psycopg 3; we pin psycopg2 (psycopg2-binary in requirements.lock).
    local quoted
    quoted="$(AMPBENCH_PSQL_PW="$password" python3 -c \
      'import os, urllib.parse; print(urllib.parse.quote(os.environ["AMPBENCH_PSQL_PW"], safe=""))')"
    # MLflow's job runner (a pool of GenAI job workers, about 12 processes of ~200 MB that poll the store) is
    # never used by ampbench: off unless MLFLOW_SERVER_ENABLE_JOB_EXECUTION says otherwise.
    MLFLOW_BACKEND_STORE_URI="postgresql+psycopg2://${db_user}:${quoted}@127.0.0.1:5432/${db_name}" \
    MLFLOW_SERVER_ENABLE_JOB_EXECUTION="${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false}" \
    nohup "$mlflow_bin" server --artifacts-destination "$dir/artifacts" \
      --serve-artifacts --host 127.0.0.1 --port "$port" --workers 2 >"$dir/mlflow.log" 2>&1 &
    echo $! >"$dir/mlflow.pid"
  fi
  for _ in $(seq 1 120); do
    if ! running; then break; fi  # it died: show why, don't wait
    if python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=2)" \
        2>/dev/null; then
      echo "MLflow server on http://127.0.0.1:$port (PostgreSQL backend, artifacts in $dir/artifacts)"
      echo "use it with:  export MLFLOW_TRACKING_URI=http://127.0.0.1:$port"
      return 0
    fi
    sleep 1
  done
  echo "MLflow server did not come up; last log lines:" >&2
  tail -n 20 "$dir/mlflow.log" >&2
  return 1
}

case "${1:-start}" in
  start)
    start_postgres
    # A running server keeps its connections' password: the role is only (re)set before a server starts.
    if ! running; then load_password; setup_role; fi
    start_mlflow ;;
  stop)
    if [ -f "$dir/mlflow.pid" ]; then
      pid="$(cat "$dir/mlflow.pid")"
      kill "$pid" 2>/dev/null || true
      # it stops its workers first: wait (up to 10 s), so a start right after finds the port free
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
      rm -f "$dir/mlflow.pid"
    fi
    echo "MLflow server stopped (PostgreSQL left running: pg_ctlcluster <version> main stop)" ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
