#!/usr/bin/env bash
# Packages: builds the .deb and .rpm with CPack from the build tree, installs the .deb
# with dpkg on this machine (user, directories, unit, configs, generated 0600 tokens),
# starts the agent from the installed files as user dltrain, purges it, and checks that
# nothing is left; checks the .rpm's file list and declared dependencies.
# Usage: package_test.sh BUILD_DIR   (as root; skipped with exit 77 otherwise)
set -euo pipefail
build="$1"
if [[ $(id -u) -ne 0 ]]; then echo "package_test: needs root"; exit 77; fi
if dpkg-query -W -f='${Status}' dltrain 2>/dev/null | grep -q "installed"; then
  echo "package_test: a dltrain package is already installed here; not touching it"; exit 77
fi
fail() { echo "FAIL: $*"; exit 1; }
out="$(mktemp -d)"
trap 'rm -rf "$out"; dpkg --purge dltrain >/dev/null 2>&1 || true' EXIT
(cd "$build" && cpack -G "DEB;RPM" -B "$out" >"$out/cpack.log" 2>&1) || { cat "$out/cpack.log"; fail "cpack failed"; }
deb="$(ls "$out"/*.deb)"
rpm="$(ls "$out"/*.rpm)"

# --- .rpm: files and dependencies (lists captured first: grep -q closing a pipe early
# would fail the pipeline under pipefail)
files="$(rpm -qpl "$rpm" 2>/dev/null)"
requires="$(rpm -qpR "$rpm" 2>/dev/null)"
scripts="$(rpm -qp --scripts "$rpm" 2>/dev/null)"
for f in /usr/bin/dltrain-agent /usr/bin/dltrain /lib/systemd/system/dltrain-agent.service /etc/dltrain/agent.toml; do
  grep -qx "$f" <<<"$files" || fail "rpm lacks $f"
done
for dep in rocksdb spdlog systemd-libs openssl-libs "pytorch >= 1.13"; do
  grep -qx "$dep" <<<"$requires" || fail "rpm does not require $dep"
done
grep -q "useradd -r" <<<"$scripts" || fail "rpm %post does not create the user"

# --- .deb: install
dpkg -i "$deb" >/dev/null || fail "dpkg -i failed"
getent passwd dltrain >/dev/null || fail "no dltrain user"
[[ -d /var/lib/dltrain && $(stat -c %U /var/lib/dltrain) == dltrain ]] || fail "state directory missing or not owned"
[[ -x /usr/bin/dltrain-agent && -f /lib/systemd/system/dltrain-agent.service ]] || fail "binaries or unit missing"
[[ -f /etc/dltrain/agent.toml ]] || fail "config missing"
dpkg-query -W -f='${Conffiles}' dltrain | grep -q /etc/dltrain/agent.toml || fail "agent.toml is not a conffile"
for t in /etc/dltrain/agent.token /etc/dltrain/client.token; do
  [[ $(stat -c %a "$t") == 600 && $(stat -c %U "$t") == dltrain ]] || fail "$t not 0600 dltrain"
done

# --- the agent starts from the installed files, as user dltrain
cfg="$out/leader.toml"
cat >"$cfg" <<TOML
leader = true
host_tasks = false
listen_address = "127.0.0.1"
listen_port = 0
agent_token_file = "/etc/dltrain/agent.token"
client_token_file = "/etc/dltrain/client.token"
state_dir = "/var/lib/dltrain"
TOML
chmod 644 "$cfg"
chmod 755 "$out"
setpriv --reuid=dltrain --regid=dltrain --init-groups /usr/bin/dltrain-agent --config "$cfg" >"$out/agent.log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do
  grep -q "leader listening on 127.0.0.1:" "$out/agent.log" && break
  sleep 0.1
done
grep -q "leader listening on 127.0.0.1:" "$out/agent.log" || { cat "$out/agent.log"; fail "installed agent did not start"; }
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
[[ $rc -eq 0 ]] || { cat "$out/agent.log"; fail "installed agent exited $rc on SIGTERM"; }
[[ -d /var/lib/dltrain/db ]] || fail "the agent kept no store in /var/lib/dltrain"

# --- purge
dpkg --purge dltrain >/dev/null || fail "dpkg --purge failed"
! getent passwd dltrain >/dev/null || fail "user left behind"
[[ ! -e /var/lib/dltrain && ! -e /etc/dltrain && ! -e /usr/bin/dltrain-agent && ! -e /lib/systemd/system/dltrain-agent.service ]] \
  || fail "files left behind"
echo "package_test: ok"
