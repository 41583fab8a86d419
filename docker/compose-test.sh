#!/usr/bin/env bash
# The compose cluster end to end under a real engine (docker/compose.local.yaml): up, the run
# reaches its step count, the trainer's container is killed mid-run and its restart policy
# brings it back, the run finishes, `asyncrl audit` of its log is clean, and `down` leaves no
# container, network or volume behind (but the policy cache, kept for the next run). Called by `docker/local.sh test` (make compose-test),
# which owns the daemon (DOCKER_HOST) and stops it afterwards; exits non-zero on any failure.
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
DOCKER="${DOCKER:-docker}"
IMAGE="${IMAGE:-asyncrl:local}"
PROJECT="asyncrl-ctest"
FILE="$REPO/docker/compose.local.yaml"
STEPS="${COMPOSE_TEST_STEPS:-40}"
KILL_AT="${COMPOSE_TEST_KILL_AT:-10}"   # the trainer is killed once it saved this step
WAIT_S="${COMPOSE_TEST_TIMEOUT_S:-900}"
if docker compose version > /dev/null 2>&1; then
    COMPOSE=(docker compose)
else
    COMPOSE=(docker-compose)
fi
COMPOSE+=(-f "$FILE" -p "$PROJECT")

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
export ASYNCRL_IMAGE="$IMAGE" RUN_ID="ct$(date +%s)" TOTAL_TRAINING_STEPS="$STEPS" SAVE_FREQ=5
BROKER_PORT="$(free_port)"
SYNC_PORT="$(free_port)"
export BROKER_PORT SYNC_PORT

T0=$SECONDS
log() { printf '[compose-test %4d s] %s\n' "$((SECONDS - T0))" "$*" >&2; }
fail() {
    log "FAILED: $*"
    for svc in setup trainer rollout-0 rollout-1 monitor broker; do
        echo "--- $svc" >&2
        "${COMPOSE[@]}" logs --no-color --tail 25 "$svc" >&2 || true
    done
    exit 1
}
# The policy cache volume stays (the daemon's data root persists in docker/local.sh's work
# dir): the warm start it holds is keyed by config and takes minutes to build on 2 cores.
down() {
    "${COMPOSE[@]}" down --remove-orphans > /dev/null 2>&1 || return 1
    "$DOCKER" volume rm "${PROJECT}_runs" > /dev/null 2>&1 || true
}
trap 'down || true' EXIT

container() { "$DOCKER" ps -aq --filter "label=com.docker.compose.project=$PROJECT" \
    --filter "label=com.docker.compose.service=$1" | head -n 1; }
state() { "$DOCKER" inspect -f "$1" "$(container "$2")"; }
run_dir() { echo "$("$DOCKER" volume inspect -f '{{.Mountpoint}}' "${PROJECT}_runs")/$RUN_ID"; }

log "up: run $RUN_ID, $STEPS steps, broker on $BROKER_PORT, ${COMPOSE[*]:0:2}"
"${COMPOSE[@]}" up -d --no-build > /dev/null 2>&1 || fail "up"
[ "$(state '{{.State.ExitCode}}' setup)" = 0 ] || fail "setup exited non-zero"
log "setup done (topics, warm-started policy, prompts)"

# Wait for the checkpoint of step KILL_AT, then kill the trainer's container. `docker kill`
# counts as a manual stop for the restart policy (moby: it is not restarted), so the crash is
# the kernel's: SIGKILL to the container's process from outside, as the OOM killer sends it.
deadline=$((SECONDS + WAIT_S))
until [ -d "$(run_dir)/checkpoints/step_$(printf %06d "$KILL_AT")" ]; do
    [ $SECONDS -lt $deadline ] || fail "no checkpoint of step $KILL_AT after ${WAIT_S} s"
    [ "$(state '{{.State.Status}}' trainer)" = running ] || fail "trainer stopped before the kill"
    sleep 1
done
pid="$(state '{{.State.Pid}}' trainer)"
log "trainer saved step $KILL_AT: SIGKILL to its process $pid"
kill -KILL "$pid"
until [ "$(state '{{.RestartCount}}' trainer)" -ge 1 ]; do
    [ $SECONDS -lt $deadline ] || fail "the trainer was not restarted"
    sleep 1
done
log "trainer restarted by its restart policy"

until [ "$(state '{{.State.Status}}' trainer)" = exited ]; do
    [ $SECONDS -lt $deadline ] || fail "the run did not finish within ${WAIT_S} s"
    sleep 2
done
[ "$(state '{{.State.ExitCode}}' trainer)" = 0 ] || fail "trainer exited non-zero"
summary="$(cat "$(run_dir)/summary.json")"
log "trainer finished: $summary"
python3 - "$summary" "$STEPS" << 'EOF' || fail "summary"
import json, sys
s = json.loads(sys.argv[1])
assert s["step"] == int(sys.argv[2]) or "target" in s["reason"], s
EOF
for svc in rollout-0 rollout-1 monitor; do
    until [ "$(state '{{.State.Status}}' "$svc")" = exited ]; do
        [ $SECONDS -lt $deadline ] || fail "$svc did not exit"
        sleep 1
    done
    [ "$(state '{{.State.ExitCode}}' "$svc")" = 0 ] || fail "$svc exited non-zero"
done
for svc in trainer rollout-0 rollout-1; do
    [ -s "$(run_dir)/traces/asyncrl-$svc.jsonl" ] || fail "no spans from $svc in traces/"
done
log "workers and monitor exited 0; every process wrote its spans"

log "asyncrl audit $RUN_ID"
"$DOCKER" run --rm --network host -v "${PROJECT}_runs:/runs" "$IMAGE" \
    audit "$RUN_ID" --output-dir /runs >&2 || fail "audit"

down || fail "down"
trap - EXIT
left="$("$DOCKER" ps -aq --filter "label=com.docker.compose.project=$PROJECT")"
[ -z "$left" ] || fail "containers left after down: $left"
left="$("$DOCKER" network ls -q --filter "label=com.docker.compose.project=$PROJECT")"
[ -z "$left" ] || fail "networks left after down: $left"
left="$("$DOCKER" volume ls -q --filter "label=com.docker.compose.project=$PROJECT" \
    | grep -vx "${PROJECT}_cache" || true)"
[ -z "$left" ] || fail "volumes left after down: $left"
log "passed: down left no container, network or volume (but the policy cache)"
