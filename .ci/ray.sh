# Sourced by .ci/run: installs the cluster extra and starts a local Ray cluster of two nodes (a
# head and a second node process, one CPU each) for tests/test_cluster.py, exported as
# ANSOR_TEST_RAY_ADDRESS and stopped when the sourcing shell exits. Runs on its own too:
# `bash .ci/ray.sh` prints the address and keeps the cluster until Enter is pressed.
python3 -m pip install --quiet -e '.[cluster]'  # Ray

ansor_ray_dir=$(mktemp -d /tmp/ansor-ray.XXXXXX)  # Ray's sessions and logs; short: socket paths are limited
ansor_ray_port=${ANSOR_RAY_PORT:-6390}
ansor_ray_options=(--num-cpus=1 --object-store-memory=100000000 --disable-usage-stats --temp-dir="$ansor_ray_dir"
                   --node-ip-address=127.0.0.1 --block)
ansor_ray_pids=()

ansor_ray_stop() {
    # `ray start --block` stops the processes of its node when it is terminated
    if [ ${#ansor_ray_pids[@]} -gt 0 ]; then
        kill "${ansor_ray_pids[@]}" 2>/dev/null || true
        wait "${ansor_ray_pids[@]}" 2>/dev/null || true
    fi
    rm -rf "$ansor_ray_dir"
}
# stop at exit, after whatever an earlier sourced script asked for at exit (its trap is kept)
ansor_ray_trap() {
    eval "set -- $(trap -p EXIT)"
    trap "${3:+$3; }ansor_ray_stop" EXIT
}
ansor_ray_trap

ray start --head --port="$ansor_ray_port" --include-dashboard=false "${ansor_ray_options[@]}" \
    >"$ansor_ray_dir/head.log" 2>&1 &
ansor_ray_pids+=($!)
export ANSOR_TEST_RAY_ADDRESS="127.0.0.1:$ansor_ray_port"
ansor_ray_nodes() {  # alive nodes of the cluster, 0 while it does not answer
    python3 -c "import logging, ray; ray.init(address='$ANSOR_TEST_RAY_ADDRESS', logging_level=logging.ERROR); \
print(sum(n['Alive'] for n in ray.nodes()))" 2>/dev/null || echo 0
}
for _ in $(seq 60); do [ "$(ansor_ray_nodes)" -ge 1 ] && break; sleep 1; done
ray start --address="$ANSOR_TEST_RAY_ADDRESS" "${ansor_ray_options[@]}" >"$ansor_ray_dir/node.log" 2>&1 &
ansor_ray_pids+=($!)
for _ in $(seq 60); do [ "$(ansor_ray_nodes)" -ge 2 ] && break; sleep 1; done
if [ "$(ansor_ray_nodes)" -lt 2 ]; then
    echo "ray.sh: the two-node Ray cluster did not start; its logs:" >&2
    tail -n 20 "$ansor_ray_dir"/*.log >&2
    exit 1
fi
echo "ray.sh: a Ray cluster of two nodes at $ANSOR_TEST_RAY_ADDRESS"

if [ "${BASH_SOURCE[0]}" = "$0" ]; then  # run on its own: keep the cluster until asked
    read -r -p "press Enter to stop it " _
fi
