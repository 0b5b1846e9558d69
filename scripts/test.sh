#!/usr/bin/env bash
# Set up everything the test suite needs on a fresh Debian machine, then run it all:
# ruff, mypy, a Docker engine, the test images and a Kubernetes test cluster (infra/), and pytest. `scripts/test.sh --fast` runs only the quick pure-logic subset.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

fast=0
if [[ "${1:-}" == "--fast" ]]; then fast=1; shift; fi

need_apt=()
command -v bwrap >/dev/null || need_apt+=(bubblewrap)
# Local sandboxes that ask for a network get user-mode egress from slirp4netns.
command -v slirp4netns >/dev/null || need_apt+=(slirp4netns)
command -v patch >/dev/null || need_apt+=(patch)
command -v git >/dev/null || need_apt+=(git)
command -v nsenter >/dev/null || need_apt+=(util-linux)
# SWE tasks run their tests with the sandbox's (the host's, on the local backend) python3.
/usr/bin/python3 -c "import pytest" 2>/dev/null || need_apt+=(python3-pytest)
# The browser recipe (orchard-gui) runs Debian's chromium: on the local backend the host's,
# with a font so pages render text. infra/images/build debootstraps orchard-test/browser.
[[ -x /usr/bin/chromium ]] || need_apt+=(chromium)
[[ -d /usr/share/fonts/truetype/liberation ]] || need_apt+=(fonts-liberation)
command -v debootstrap >/dev/null || need_apt+=(debootstrap)
# The image store's pull tests run a real OCI registry (the CNCF distribution server).
[[ -x /usr/bin/docker-registry ]] || need_apt+=(docker-registry)
if ((${#need_apt[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "missing system packages: ${need_apt[*]} (run as root, or install them)" >&2
    exit 1
  fi
  echo "==> apt-get install ${need_apt[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if ! command -v uv >/dev/null; then
  echo "==> installing uv"
  python3 -m pip install -q uv
fi

echo "==> uv sync"
uv sync --frozen --all-packages -q

echo "==> ruff"
uv run ruff check .
uv run ruff format --check .
echo "==> mypy"
uv run mypy

if ((! fast)); then
  # The Docker backend's tests run against a real engine and locally built images.
  bash infra/docker/up
  infra/images/build
  infra/agent/smoke --no-build  # the injected agent answers in the busybox and Debian images
  # The Kubernetes backend's tests run against a real single-node cluster (API 1.20, built
  # from Debian's source package once per machine and cached outside the clone).
  bash infra/test-cluster/up
  infra/test-cluster/smoke  # agent injection, host->pod, pod->pod, pod->API server, delete
fi

echo "==> pytest"
markers=()
if ((fast)); then markers=(-m fast); fi
# The slowest tests, so a run that grows slow shows where the time went.
markers+=(--durations=40)
set +e
uv run pytest "${markers[@]}" "$@"
rc=$?
set -e
if [[ $rc -eq 5 ]]; then
  echo "pytest collected no tests: that is a failure here" >&2
  exit 1
fi
exit $rc
