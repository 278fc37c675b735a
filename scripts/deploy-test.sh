#!/usr/bin/env bash
# make deploy-test: build genhook's container image for real (the Dockerfile, target cpu) with
# Debian's podman and run deploy/compose.yaml with podman-compose (deploy/test/stack.py):
# PostgreSQL and an S3 store as containers built the same way (deploy/test/compose.test.yaml),
# the migration, one api, two workers and one dispatcher; an edit with its signed webhook
# received on this host, a worker killed mid-task and the task run again, workers scaled up
# and down.
#
# Where the base image cannot be pulled, it is built here (mmdebstrap of Debian bookworm)
# and imported under the name the Dockerfile uses. On hosts with cgroup v1 (or a hybrid
# mount) podman runs with runc and the cgroupfs manager, and container ulimits at or below
# the host's (a containers.conf of its own). Everything it starts is removed on exit, and every
# step has a deadline (CI runs it unattended).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
START=$(date +%s)
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
BASE_IMAGE=docker.io/library/debian:bookworm-slim
IMAGE=localhost/genhook:deploy-test
PG_IMAGE=localhost/genhook-test-postgres:deploy-test
S3_IMAGE=localhost/genhook-test-s3:deploy-test
PROJECT=genhook-deploy-test-$$
PODMAN_COMPOSE_VERSION=1.6.0
WORK=$(mktemp -d /tmp/genhook-deploy-test.XXXXXX)

say() { echo "[deploy-test +$(($(date +%s) - START))s] $*"; }

cleanup() {
  status=$?
  trap - EXIT INT TERM
  if [ -n "${BUILD_PID:-}" ]; then kill -INT "$BUILD_PID" 2>/dev/null || true; wait "$BUILD_PID" 2>/dev/null || true; fi
  if command -v podman >/dev/null 2>&1 && [ -n "${CONTAINERS_CONF:-}" ]; then
    # The compose project: its containers with their anonymous volumes, its volumes, its network.
    for id in $(podman ps -aq --filter "label=io.podman.compose.project=$PROJECT"); do
      podman rm -f -v -t 0 "$id" >/dev/null 2>&1 || true
    done
    for volume in $(podman volume ls -q --filter "label=io.podman.compose.project=$PROJECT"); do
      podman volume rm -f "$volume" >/dev/null 2>&1 || true
    done
    podman network rm -f "${PROJECT}_default" >/dev/null 2>&1 || true
    # The working containers of a build this run interrupted.
    for id in $(comm -13 <(echo "${EXTERNAL_BEFORE:-}") <(podman ps -aq --external --no-trunc | sort)); do
      podman rm -f "$id" >/dev/null 2>&1 || true
    done
    # Build leftovers: intermediate containers of an interrupted build, and the images this
    # run's builds replaced under the same tags.
    for old in ${REPLACED_IMAGES:-}; do podman rmi "$old" >/dev/null 2>&1 || true; done
    # The images and their layer cache stay for the next run (a rebuild of the Python
    # environment takes minutes); DEPLOY_TEST_REMOVE_IMAGES=1 removes them too.
    if [ "${DEPLOY_TEST_REMOVE_IMAGES:-0}" = 1 ]; then
      podman rmi -f "$IMAGE" "$PG_IMAGE" "$S3_IMAGE" >/dev/null 2>&1 || true
      podman image prune -f >/dev/null 2>&1 || true
    fi
  fi
  if [ -n "${STACK_PID:-}" ]; then kill "$STACK_PID" 2>/dev/null || true; wait "$STACK_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
  if [ "$status" -eq 0 ]; then say "passed"; else say "FAILED (exit $status)"; fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# podman with runc, and netavark with aardvark-dns for the compose network (its service
# names): podman's own dependencies would also be met by the CNI plugins, which have no DNS.
need_packages=()
for tool in podman:podman runc:runc mmdebstrap:mmdebstrap iptables:iptables newuidmap:uidmap \
  /usr/lib/podman/netavark:netavark /usr/lib/podman/aardvark-dns:aardvark-dns; do
  command -v "${tool%%:*}" >/dev/null 2>&1 || need_packages+=("${tool#*:}")
done
if [ ${#need_packages[@]} -gt 0 ]; then
  say "installing ${need_packages[*]} (Debian packages)"
  if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo -n"; fi  # never a password prompt
  $SUDO timeout 600 apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive timeout 1200 apt-get install -y -qq --no-install-recommends \
    "${need_packages[@]}" >/dev/null
fi

# podman's settings for this host: crun refuses a cgroup v1 or hybrid host and the default
# ulimits may be above what this process may raise to.
nofile=$(ulimit -Hn); nproc=$(ulimit -Hu)
[ "$nofile" = unlimited ] && nofile=1048576
[ "$nproc" = unlimited ] && nproc=1048576
nofile=$((nofile < 1024 ? nofile : 1024)); nproc=$((nproc < 1024 ? nproc : 1024))
{
  echo "[containers]"
  echo "default_ulimits = [\"nofile=$nofile:$nofile\", \"nproc=$nproc:$nproc\"]"
  echo "[engine]"
  echo "events_logger = \"file\""
  if [ "$(stat -fc %T /sys/fs/cgroup)" != "cgroup2fs" ]; then
    echo "runtime = \"runc\""
    echo "cgroup_manager = \"cgroupfs\""
  fi
  echo "[network]"
  echo "network_backend = \"netavark\""
} >"$WORK/containers.conf"
export CONTAINERS_CONF=$WORK/containers.conf
EXTERNAL_BEFORE=$(podman ps -aq --external --no-trunc | sort)
say "podman $(podman --version | awk '{print $3}'), $(grep -E 'runtime|cgroup_manager' "$CONTAINERS_CONF" | tr -d ' "' | paste -sd, -), ulimits nofile=$nofile nproc=$nproc"

if ! podman image exists "$BASE_IMAGE"; then
  if timeout 60 podman pull -q "$BASE_IMAGE" >/dev/null 2>&1; then
    say "pulled $BASE_IMAGE"
  else
    say "$BASE_IMAGE cannot be pulled: building it with mmdebstrap (Debian bookworm, minbase)"
    timeout 1200 mmdebstrap --quiet --variant=minbase --include=ca-certificates \
      --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
      --dpkgopt='path-exclude=/usr/share/locale/*' \
      --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
      bookworm "$WORK/base.tar"
    timeout 300 podman import --quiet "$WORK/base.tar" "$BASE_IMAGE" >/dev/null
    rm -f "$WORK/base.tar"
  fi
fi

# The host's CA bundle, for a network that inspects TLS (a build secret: it enters no layer).
SECRET=()
CA_BUNDLE=${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}
[ -s "$CA_BUNDLE" ] && SECRET=(--secret "id=ca-bundle,src=$CA_BUNDLE")

REPLACED_IMAGES=""
build() {  # build TAG ARGS...: remembers the image the tag named before, to remove it
  local tag=$1; shift
  local before; before=$(podman image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
  timeout 2400 podman build --quiet --pull=never --format docker --layers "${SECRET[@]}" -t "$tag" "$@" >"$WORK/build.log" 2>&1 &
  BUILD_PID=$!
  wait "$BUILD_PID" || { tail -40 "$WORK/build.log" >&2; BUILD_PID=""; return 1; }
  BUILD_PID=""
  local after; after=$(podman image inspect --format '{{.Id}}' "$tag")
  if [ -n "$before" ] && [ "$before" != "$after" ]; then REPLACED_IMAGES="$REPLACED_IMAGES $before"; fi
}
say "building $IMAGE (Dockerfile, target cpu)"
build "$IMAGE" --target cpu -f Dockerfile .
say "building the test PostgreSQL and S3 images"
build "$PG_IMAGE" -f deploy/test/postgres.Containerfile deploy/test
build "$S3_IMAGE" -f deploy/test/s3.Containerfile deploy/test
say "image: $(podman image inspect --format '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1/1e6}')"

# What the final stage must be: a user of its own, no compilers, genhook as the entrypoint.
user=$(podman image inspect --format '{{.Config.User}}' "$IMAGE")
[ "${user%%:*}" = 10001 ] || { echo "the image runs as '$user', not 10001" >&2; exit 1; }
podman run --rm --health-interval disable --entrypoint /bin/sh "$IMAGE" -c \
  'for c in gcc cc c++ g++ clang make ld; do if command -v $c; then exit 1; fi; done; [ "$(id -u)" = 10001 ]' \
  || { echo "the final image holds a compiler or runs as root" >&2; exit 1; }
podman run --rm --health-interval disable "$IMAGE" --help >/dev/null
podman image inspect --format '{{json .Config.Healthcheck}}' "$IMAGE" | grep -q healthcheck.py \
  || { echo "the image has no HEALTHCHECK" >&2; exit 1; }
say "image checks passed (user 10001, no compilers, entrypoint genhook, HEALTHCHECK)"

# podman-compose from PyPI, pinned, in a virtual environment of this run's own.
say "installing podman-compose $PODMAN_COMPOSE_VERSION"
python3 -m venv "$WORK/compose"
timeout 600 "$WORK/compose/bin/pip" install --quiet --disable-pip-version-check \
  "podman-compose==$PODMAN_COMPOSE_VERSION"
export GENHOOK_IMAGE=$IMAGE GENHOOK_TEST_POSTGRES_IMAGE=$PG_IMAGE GENHOOK_TEST_S3_IMAGE=$S3_IMAGE
say "running deploy/compose.yaml (project $PROJECT)"
PODMAN="podman" timeout 1800 "$PYTHON" deploy/test/stack.py "$WORK/compose/bin/podman-compose" "$PROJECT" &
STACK_PID=$!
wait "$STACK_PID"
STACK_PID=""
say "done in $(($(date +%s) - START)) s"
