#!/usr/bin/env bash
# Team mode: an MLflow tracking server backed by PostgreSQL, with a served artifact store, bound to 127.0.0.1.
#   bash scripts/team_server.sh start    # installs PostgreSQL from the distribution if missing (needs root),
#                                        # starts it and the MLflow server, prints the MLFLOW_TRACKING_URI to use
#   bash scripts/team_server.sh stop
# Settings (environment): MLFLOW_PORT (5001), TEAM_DIR (.team: artifacts, logs, pid), AMPBENCH_DB_PASSWORD.
# Remote access: keep the bind on loopback and tunnel (ssh -L 5001:127.0.0.1:5001 host), or put an
# authenticating proxy in front and pass --allowed-hosts; never disable MLflow's security middleware.
set -euo pipefail
cd "$(dirname "$0")/.."
port="${MLFLOW_PORT:-5001}"
dir="$(mkdir -p "${TEAM_DIR:-.team}" && cd "${TEAM_DIR:-.team}" && pwd)"
password="${AMPBENCH_DB_PASSWORD:-ampbench}"
mlflow_bin="${MLFLOW_BIN:-$PWD/.venv/bin/mlflow}"
# SQLAlchemy 2.1 maps plain postgresql:// to psycopg 3; we pin psycopg2 (psycopg2-binary in requirements.lock)
uri="postgresql+psycopg2://ampbench:${password}@127.0.0.1:5432/ampbench"

as_postgres() { runuser -u postgres -- "$@"; }

start_postgres() {
  if ! command -v pg_lsclusters >/dev/null 2>&1; then
    echo "installing PostgreSQL from the distribution's packages"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  fi
  read -r version cluster _ < <(pg_lsclusters -h | head -n 1)
  pg_lsclusters -h | head -n 1 | grep -q online || pg_ctlcluster "$version" "$cluster" start
  as_postgres psql -qtAc "SELECT 1 FROM pg_roles WHERE rolname = 'ampbench'" | grep -q 1 ||
    as_postgres psql -qc "CREATE ROLE ampbench LOGIN PASSWORD '${password}'"
  as_postgres psql -qtAc "SELECT 1 FROM pg_database WHERE datname = 'ampbench'" | grep -q 1 ||
    as_postgres psql -qc "CREATE DATABASE ampbench OWNER ampbench"
}

start_mlflow() {
  if [ -f "$dir/mlflow.pid" ] && kill -0 "$(cat "$dir/mlflow.pid")" 2>/dev/null; then
    echo "MLflow server already running (pid $(cat "$dir/mlflow.pid"))"
  else
    # MLflow's job runner (a pool of GenAI job workers, about 12 processes of ~200 MB that poll the store) is
    # never used by ampbench: off unless MLFLOW_SERVER_ENABLE_JOB_EXECUTION says otherwise.
    MLFLOW_SERVER_ENABLE_JOB_EXECUTION="${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false}" \
    nohup "$mlflow_bin" server --backend-store-uri "$uri" --artifacts-destination "$dir/artifacts" \
      --serve-artifacts --host 127.0.0.1 --port "$port" --workers 2 >"$dir/mlflow.log" 2>&1 &
    echo $! >"$dir/mlflow.pid"
  fi
  for _ in $(seq 1 120); do
    if ! kill -0 "$(cat "$dir/mlflow.pid")" 2>/dev/null; then break; fi  # it died: show why, don't wait
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
  start) start_postgres; start_mlflow ;;
  stop)
    if [ -f "$dir/mlflow.pid" ]; then kill "$(cat "$dir/mlflow.pid")" 2>/dev/null || true; rm -f "$dir/mlflow.pid"; fi
    echo "MLflow server stopped (PostgreSQL left running: pg_ctlcluster <version> main stop)" ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
