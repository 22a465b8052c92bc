#!/usr/bin/env bash
# Download the pure-Python (and pydantic-core) wheels that the GPU machine lacks into .whl/ (git-ignored),
# for Python 3.12 on x86_64; carry .whl with the device call and bench/gpu_check.sh installs them.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
pkgs=(
  opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-proto==1.45.2
  opentelemetry-semantic-conventions==0.66b2 opentelemetry-exporter-otlp-proto-common==1.45.2
  opentelemetry-exporter-otlp-proto-http==1.45.2 googleapis-common-protos importlib-metadata
  pydantic==2.13.4 pydantic-core==2.46.4 annotated-types typing-inspection orjson==3.13.0 msgspec==0.23.0
)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${plat[@]}" -d .whl "${pkgs[@]}"
ls .whl
