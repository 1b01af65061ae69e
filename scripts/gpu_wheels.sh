#!/usr/bin/env bash
# Fill .whl/ (git-ignored) with exactly the wheels the GPU machine lacks for the pipeline: CPython 3.12, manylinux
# x86_64, one version of each, the versions of requirements.lock (this venv's); a package with only a source
# distribution is built here (pure Python only: a compiled one fails with its name). Then checks the set against its
# own metadata and the GPU image's package list (scripts/gpu_wheels.py check), prints the total size and fails if
# the wheels and the checkout together would exceed the 56 MiB kept for them out of the 64 MiB a run carries.
#   bash scripts/gpu_wheels.sh              # after `make install`; needs PyPI (here, not on the GPU machine)
#   WHEEL_DIR=/tmp/w bash scripts/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-.venv/bin/python}"
dir="${WHEEL_DIR:-.whl}"
limit_mib="${LIMIT_MIB:-56}"
[ -x "$py" ] || { echo "error: $py not found: run \`make install\` first (the plan reads its versions)" >&2; exit 2; }
plan=$(mktemp); src=$(mktemp -d); trap 'rm -rf "$plan" "$src"' EXIT
"$py" scripts/gpu_wheels.py plan > "$plan"
rm -rf "$dir"; mkdir -p "$dir"
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
# --no-deps: the plan is already the whole closure. Without --only-binary pip may fall back to an sdist, built below.
"$py" -m pip download --quiet --disable-pip-version-check --no-deps --prefer-binary --python-version 3.12 \
  --implementation cp --abi cp312 --abi abi3 --abi none "${platforms[@]}" -d "$src" -r "$plan" 2>&1 \
  | grep -v "^WARNING: Location 'file:" >&2 || true
for f in "$src"/*; do
  case "$f" in
    *.whl) mv "$f" "$dir/" ;;
    *) "$py" -m pip wheel --quiet --disable-pip-version-check --no-deps --no-build-isolation -w "$src/built" "$f" \
         2>&1 | grep -v "^WARNING: Location 'file:" >&2 || true
       for w in "$src"/built/*.whl; do
         case "$w" in
           *-py3-none-any.whl|*-py2.py3-none-any.whl) mv "$w" "$dir/"; echo "built locally (no wheel on PyPI): $(basename "$w")" ;;
           *) echo "error: $(basename "$f") has no 3.12 manylinux wheel and builds compiled code here" >&2; exit 1 ;;
         esac
       done ;;
  esac
done
want=$(wc -l < "$plan"); got=$(find "$dir" -type f -name '*.whl' | wc -l)
[ "$got" -eq "$want" ] || { echo "error: $got wheels for $want planned packages (see pip's output above)" >&2; exit 1; }
"$py" scripts/gpu_wheels.py check "$dir"
wheels=$(du -cb "$dir"/*.whl | tail -1 | cut -f1)
checkout=$(git ls-files -z --cached --others --exclude-standard 2>/dev/null | xargs -0 -r du -cb 2>/dev/null | awk '/total$/ {s+=$1} END {print s+0}')
total=$((wheels + checkout))
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
echo "wheels: $got files, $(mib "$wheels"); checkout: $(mib "$checkout"); together $(mib "$total") (limit $limit_mib MiB)"
largest=$(ls -S "$dir" | head -4 | tr '\n' ' ')
echo "largest: $largest"
if [ "$total" -gt $((limit_mib * 1048576)) ]; then
  echo "error: over the limit: the GPU run carries at most 64 MiB in all" >&2; exit 1
fi
