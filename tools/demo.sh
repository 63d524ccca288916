#!/usr/bin/env bash
# The main job: install, build, create two uroce devices on loopback and run the unmodified
# ibv_rc_pingpong between them.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
"$top/tools/setup.sh"
build="$top/build"
[[ -f "$build/build.ninja" ]] || meson setup "$build" "$top" >/dev/null
ninja -C "$build" >/dev/null
uroce="$build/tools/uroce"
export UROCE_ROOT="${UROCE_ROOT:-$(mktemp -d /tmp/uroce-demo.XXXXXX)}"
cleanup() {
  [[ -n "${server:-}" ]] && kill "$server" 2>/dev/null || true
  "$uroce" del demo0 >/dev/null 2>&1 || true
  "$uroce" del demo1 >/dev/null 2>&1 || true
}
trap cleanup EXIT
"$uroce" add demo0 --ip 127.0.0.1
"$uroce" add demo1 --ip 127.0.0.2
echo "== uroce list"; "$uroce" list
echo "== ibv_devices"; "$uroce" run -- ibv_devices
port=$((20000 + $$ % 20000))
echo "== ibv_rc_pingpong server (demo0) and client (demo1)"
"$uroce" run -- timeout 60 ibv_rc_pingpong -d demo0 -g 0 -p "$port" -n 10000 -s 4096 > "$UROCE_ROOT/server.log" 2>&1 &
server=$!
for _ in $(seq 100); do
  ss -ltn 2>/dev/null | grep -q ":$port " && break
  sleep 0.1
done
"$uroce" run -- timeout 60 ibv_rc_pingpong -d demo1 -g 0 -p "$port" -n 10000 -s 4096 127.0.0.1
wait "$server"; server=
echo "-- server said:"; cat "$UROCE_ROOT/server.log"
