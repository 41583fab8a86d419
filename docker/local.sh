#!/usr/bin/env bash
# The compose cluster on a machine with no image registry: a Docker engine from Debian's
# packages, a daemon this script owns, a Debian base image made with debootstrap from the
# mirror apt already uses, and the asyncrl image built on it (docker/Dockerfile).
#
#   docker/local.sh images     engine, daemon, base image, asyncrl image (cached), daemon stopped
#   docker/local.sh test       the above, then docker/compose.local.yaml end to end (compose-test)
#   docker/local.sh start      start the daemon and print the DOCKER_HOST to export
#   docker/local.sh stop       stop it (and every container it runs)
#   docker/local.sh clean      stop it and delete the work dir (daemon data, cached tarball)
#
# Everything lives in ASYNCRL_DOCKER_DIR (/var/tmp/asyncrl-docker): the daemon's data root,
# exec root, socket, pid file and log, the base image's tarball, and the build inputs (torch's
# CPU wheel, the CA bundle), which are never part of the repository. Root and Debian (apt)
# for the engine install; an engine already there is used as is.
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
WORK="${ASYNCRL_DOCKER_DIR:-/var/tmp/asyncrl-docker}"
DRIVER="${ASYNCRL_DOCKER_DRIVER:-}"          # overlay2, vfs; empty: overlay2, else vfs
SUITE="${ASYNCRL_DEBIAN_SUITE:-bookworm}"     # python3 3.11: torch's cp311 wheel
BASE_IMAGE="local/debian-python:$SUITE"
IMAGE="${ASYNCRL_IMAGE:-asyncrl:local}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
CA_BUNDLE="${ASYNCRL_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
VENV="${ASYNCRL_CONSTRAINTS_VENV:-$REPO/.venv}"   # the image gets the versions installed here
SOCK="$WORK/docker.sock"
PIDFILE="$WORK/docker.pid"
export DOCKER_HOST="unix://$SOCK"
# The client shipped with the engine (Debian's 20.10): it builds with BuildKit without buildx.
DOCKER="${DOCKER:-$(command -v /usr/bin/docker || command -v docker || true)}"

log() { printf '[local.sh %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

install_engine() {
    local missing=()
    command -v dockerd > /dev/null || missing+=(docker.io)
    command -v debootstrap > /dev/null || missing+=(debootstrap)
    command -v docker-compose > /dev/null || docker compose version > /dev/null 2>&1 \
        || missing+=(docker-compose)
    [ ${#missing[@]} -eq 0 ] && return
    [ "$(id -u)" -eq 0 ] || die "needs ${missing[*]}: run as root, or install them"
    command -v apt-get > /dev/null || die "needs ${missing[*]} and this is not Debian (apt)"
    log "installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
    DOCKER="$(command -v /usr/bin/docker || command -v docker)"
}

daemon_up() { [ -S "$SOCK" ] && "$DOCKER" version > /dev/null 2>&1; }

start_daemon() {
    mkdir -p "$WORK"
    if daemon_up; then return; fi
    local drivers=("$DRIVER")
    [ -n "$DRIVER" ] || drivers=(overlay2 vfs)
    for driver in "${drivers[@]}"; do
        log "starting dockerd ($driver) at $SOCK"
        # Host networking only: no docker0 bridge and no iptables rules on a shared machine.
        dockerd --storage-driver="$driver" --data-root "$WORK/data-$driver" \
            --exec-root "$WORK/exec" --pidfile "$PIDFILE" --host "$DOCKER_HOST" \
            --iptables=false --ip-masq=false --bridge=none \
            > "$WORK/dockerd-$driver.log" 2>&1 &
        for _ in $(seq 60); do
            daemon_up && break
            kill -0 $! 2> /dev/null || break
            sleep 1
        done
        if daemon_up; then
            echo "$driver" > "$WORK/driver"
            return
        fi
        log "dockerd with $driver did not start: $(tail -n 3 "$WORK/dockerd-$driver.log")"
        kill $! 2> /dev/null || true
        wait $! 2> /dev/null || true
    done
    die "no storage driver worked (logs: $WORK/dockerd-*.log)"
}

stop_daemon() {
    [ -f "$PIDFILE" ] || return 0
    local pid
    pid="$(cat "$PIDFILE")"
    if daemon_up; then
        local running
        running="$("$DOCKER" ps -q)"
        [ -z "$running" ] || "$DOCKER" kill $running > /dev/null
    fi
    log "stopping dockerd ($pid)"
    kill "$pid" 2> /dev/null || true
    for _ in $(seq 60); do
        kill -0 "$pid" 2> /dev/null || break
        sleep 1
    done
    kill -0 "$pid" 2> /dev/null && die "dockerd $pid did not stop"
    rm -f "$PIDFILE"
}

# The mirror apt uses for this suite (its sources), so no registry or host is named here.
debian_mirror() {
    apt-get indextargets --format '$(SITE) $(RELEASE)' 2> /dev/null \
        | awk -v s="$SUITE" '$2 == s { print $1; exit }'
}

# Debian minbase with python3 and a venv on PATH at /opt/python: docker/Dockerfile's `pip
# install` then works as on python:3.11-slim (Debian's own python refuses pip, PEP 668).
build_base() {
    if "$DOCKER" image inspect "$BASE_IMAGE" > /dev/null 2>&1; then return; fi
    local tarball="$WORK/base-$SUITE.tar"
    if [ ! -f "$tarball" ]; then
        local mirror rootfs="$WORK/rootfs-$SUITE"
        mirror="$(debian_mirror)"
        [ -n "$mirror" ] || die "apt has no source for $SUITE (apt-get indextargets)"
        log "debootstrap $SUITE from $mirror"
        rm -rf "$rootfs"
        debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
            "$SUITE" "$rootfs" "$mirror" > "$WORK/debootstrap.log" 2>&1 \
            || die "debootstrap failed: $(tail -n 5 "$WORK/debootstrap.log")"
        chroot "$rootfs" python3 -m venv /opt/python
        rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
        tar -C "$rootfs" -cf "$tarball.part" .
        mv "$tarball.part" "$tarball"
        rm -rf "$rootfs"
    fi
    log "importing $tarball as $BASE_IMAGE"
    "$DOCKER" import \
        --change 'ENV PATH=/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' \
        "$tarball" "$BASE_IMAGE" > /dev/null
}

# docker/inputs/ (ignored by git) is where the build finds torch's wheel and pip's constraints;
# the CA bundle goes in as a BuildKit secret. The wheel is named like the Python in the base
# image, from pip's find-links directories (pip config) or PIP_FIND_LINKS. The constraints
# are the versions installed in the project's .venv (the ones `make test` ran with): without
# them pip backtracks for many minutes through PyPI's releases (faust's click<8.4 against
# transformers' chain) and may settle on others.
stage_inputs() {
    local inputs="$REPO/docker/inputs" dirs wheel=""
    rm -f "$inputs/constraints.txt"
    if [ -x "$VENV/bin/python" ]; then
        # The image has no vLLM: click and huggingface_hub are left to pip under faust's
        # click<8.4 (the venv's vLLM moved them past it, and the image would not resolve).
        "$VENV/bin/python" -m pip freeze --exclude-editable 2> /dev/null | grep -v ' @ ' \
            | grep -v -i -e '^click==' -e '^huggingface.hub==' > "$inputs/constraints.txt"
        echo 'click<8.4' >> "$inputs/constraints.txt"
        log "pip constraints: the $(wc -l < "$inputs/constraints.txt") versions in $VENV"
    else
        log "no $VENV: pip resolves the image's dependencies on its own"
    fi
    dirs="${PIP_FIND_LINKS:-} $(pip config list 2> /dev/null | sed -n "s/.*find-links='\(.*\)'/\1/p")"
    for dir in $dirs; do
        dir="${dir#file://}"
        for w in "$dir"/torch-"$TORCH_VERSION"+cpu-cp311-*.whl; do
            [ -f "$w" ] && wheel="$w" && break 2
        done
    done
    rm -f "$inputs"/torch-*.whl
    if [ -n "$wheel" ]; then
        ln "$wheel" "$inputs/" 2> /dev/null || cp "$wheel" "$inputs/"
        log "torch from $wheel"
    else
        log "no local torch-$TORCH_VERSION+cpu wheel: the build uses PyTorch's CPU index"
    fi
}

build_image() {
    stage_inputs
    local secret=()
    [ -f "$CA_BUNDLE" ] && secret=(--secret "id=pip_cert,src=$CA_BUNDLE")
    log "building $IMAGE on $BASE_IMAGE"
    # Host network: the daemon has no bridge. BuildKit's cache keys on the Dockerfile and
    # the files it copies, so an unchanged tree rebuilds nothing.
    DOCKER_BUILDKIT=1 "$DOCKER" build --network host --progress plain \
        --build-arg "BASE_IMAGE=$BASE_IMAGE" --build-arg "TORCH_VERSION=$TORCH_VERSION" \
        "${secret[@]}" -f "$REPO/docker/Dockerfile" -t "$IMAGE" "$REPO" \
        > "$WORK/build.log" 2>&1 || die "image build failed: $(tail -n 20 "$WORK/build.log")"
    rm -f "$REPO"/docker/inputs/torch-*.whl "$REPO/docker/inputs/constraints.txt"
    # The image this build replaced, untagged now: 1.7 GB each time a package file changes.
    "$DOCKER" image prune -f > /dev/null
}

report() {
    log "storage driver $(cat "$WORK/driver"); work dir $(du -sh "$WORK" 2> /dev/null | cut -f1)"
    "$DOCKER" image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' >&2
}

images() {
    install_engine
    start_daemon
    local t0=$SECONDS
    build_base
    log "base image ready in $((SECONDS - t0)) s"
    t0=$SECONDS
    build_image
    log "asyncrl image ready in $((SECONDS - t0)) s"
    report
}

case "${1:-}" in
    images)
        trap stop_daemon EXIT
        images
        ;;
    test)
        trap stop_daemon EXIT
        images
        DOCKER="$DOCKER" IMAGE="$IMAGE" "$REPO/docker/compose-test.sh"
        ;;
    start)
        install_engine
        start_daemon
        echo "export DOCKER_HOST=$DOCKER_HOST"
        ;;
    stop) stop_daemon ;;
    clean)
        stop_daemon
        rm -rf "$WORK"
        ;;
    *)
        sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
        exit 2
        ;;
esac
