#!/usr/bin/env bash
# Run one command as N cooperating JAX processes on this machine, the way it runs on N hosts.
#
#   launch/multiprocess.sh NUM_PROCESSES COMMAND [ARGS...]
#   launch/multiprocess.sh 2 python launch/run.py --config=configs/arith.py:smoke \
#       --config.mesh.cand=2 --mode=search --workdir=runs/arith_2proc
#
# Process i (0 <= i < N) gets the environment that `derl_jax.parallel.maybe_initialize_distributed`
# reads, exactly what a user sets on host i of an N-host job:
#
#   JAX_COORDINATOR_ADDRESS=<host of process 0>:<port>   here 127.0.0.1:$DERL_COORDINATOR_PORT
#   JAX_NUM_PROCESSES=N
#   JAX_PROCESS_ID=i
#
# JAX then forms one job: jax.devices() lists every process's devices, a mesh spans them and
# the cross-process collectives of the CPU backend run over gloo (the default). Only process 0
# writes the run directory; every process must see it (a shared file system on real hosts).
#
# Output: process 0 prints as usual; the lines of process i > 0 carry a "[process i] " prefix.
# The script waits for all processes and exits with the first non-zero status (stopping the
# others, which would otherwise wait forever in a collective), or 0 when all succeed.
#
# Environment:
#   DERL_COORDINATOR_PORT  port of the coordinator on 127.0.0.1 (default: a free port)
#   JAX_PLATFORMS          default "cpu" (set it to run on local accelerators instead)
set -u

usage() {
  echo "usage: $0 NUM_PROCESSES COMMAND [ARGS...]" >&2
  exit 2
}
[ $# -ge 2 ] || usage
num_processes=$1
shift
case "$num_processes" in
  '' | *[!0-9]*) echo "$0: NUM_PROCESSES must be a positive integer, got '$num_processes'" >&2; exit 2 ;;
esac
[ "$num_processes" -ge 1 ] || { echo "$0: NUM_PROCESSES must be at least 1, got $num_processes" >&2; exit 2; }

port=${DERL_COORDINATOR_PORT:-}
if [ -z "$port" ]; then
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
fi

pids=()
watchdog=
stop_all() {  # SIGTERM, then SIGKILL for a process still running 10 s later
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  if [ -z "$watchdog" ]; then
    (sleep 10; for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done) >/dev/null 2>&1 &
    watchdog=$!
  fi
}
trap 'stop_all; exit 130' INT TERM

for ((i = 0; i < num_processes; i++)); do
  if [ "$i" -eq 0 ]; then
    JAX_COORDINATOR_ADDRESS="127.0.0.1:$port" JAX_NUM_PROCESSES=$num_processes JAX_PROCESS_ID=$i \
      JAX_PLATFORMS=${JAX_PLATFORMS:-cpu} "$@" &
  else
    JAX_COORDINATOR_ADDRESS="127.0.0.1:$port" JAX_NUM_PROCESSES=$num_processes JAX_PROCESS_ID=$i \
      JAX_PLATFORMS=${JAX_PLATFORMS:-cpu} "$@" > >(sed -u "s/^/[process $i] /") 2>&1 &
  fi
  pids+=($!)
done

status=0
running=("${pids[@]}")
while [ "${#running[@]}" -gt 0 ]; do
  wait -n -p finished "${running[@]}"
  code=$?
  still=()
  for pid in "${running[@]}"; do [ "$pid" = "$finished" ] || still+=("$pid"); done
  running=("${still[@]}")
  if [ "$code" -ne 0 ] && [ "$status" -eq 0 ]; then
    status=$code
    echo "$0: a process (pid $finished) exited with status $code; stopping the others" >&2
    stop_all
  fi
done
[ -z "$watchdog" ] || kill "$watchdog" 2>/dev/null  # every process has ended
exit "$status"
