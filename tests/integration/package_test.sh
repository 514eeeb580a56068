#!/usr/bin/env bash
# Packages: builds the .deb and .rpm with CPack from the build tree, installs the .deb
# with dpkg on this machine (user, directories, unit, configs, generated 0600 tokens),
# starts the agent from the installed files as user dltrain, purges it, and checks that
# nothing is left; checks the .rpm's file list and declared dependencies, installs it
# with `rpm --root` into a scratch root (a minimal userland: busybox plus the shadow
# tools an RPM distribution has) with its scriptlets, reinstalls and erases it there.
# Usage: package_test.sh BUILD_DIR   (as root with rpm and busybox; skipped with exit 77
# otherwise)
set -euo pipefail
build="$1"
if [[ $(id -u) -ne 0 ]]; then echo "package_test: needs root"; exit 77; fi
for tool in rpm busybox; do
  command -v "$tool" >/dev/null || { echo "package_test: needs $tool (scripts/setup installs it)"; exit 77; }
done
if dpkg-query -W -f='${Status}' dltrain 2>/dev/null | grep -q "installed"; then
  echo "package_test: a dltrain package is already installed here; not touching it"; exit 77
fi
fail() { echo "FAIL: $*"; exit 1; }
out="$(mktemp -d)"
root="$(mktemp -d)"
trap 'rm -rf "$out" "$root"; dpkg --purge dltrain >/dev/null 2>&1 || true' EXIT
mkdir -p "$root/dev"
if ! mknod -m 0666 "$root/dev/null" c 1 3 || ! mknod -m 0444 "$root/dev/urandom" c 1 9; then
  echo "package_test: cannot create device nodes for the .rpm's scratch root (no CAP_MKNOD)"; exit 77
fi
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
grep -q "useradd --system" <<<"$scripts" || fail "rpm %post does not create the user"

# --- .rpm: install into a scratch root. rpm runs the scriptlets chrooted into it, so it
# gets a minimal userland: busybox for the shell and the file utilities, the tools an
# RPM distribution's shadow-utils and glibc provide (useradd, groupadd, getent), copied
# from this machine with their libraries, /dev/null and /dev/urandom (made above). No
# systemd runs there (no /run/systemd/system).
copy_with_libs() {  # copy_with_libs FILE: FILE and the shared libraries it loads
  local f="$1" lib
  mkdir -p "$root$(dirname "$f")"
  cp -L "$f" "$root$f"
  for lib in $(ldd "$f" 2>/dev/null | grep -o '/[^ ]*' || true); do
    [[ -e "$root$lib" ]] && continue
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
}
mkdir -p "$root"/{bin,etc,tmp,run}
chmod 1777 "$root/tmp"
copy_with_libs "$(readlink -f "$(command -v busybox)")"
mv "$root$(readlink -f "$(command -v busybox)")" "$root/bin/busybox"
for applet in sh chmod chown grep head mkdir od tr; do
  ln -s busybox "$root/bin/$applet"
done
mkdir -p "$root/usr/sbin"
ln -s ../../bin/busybox "$root/usr/sbin/nologin"  # the system user's shell (util-linux's there)
for tool in useradd groupadd getent; do
  copy_with_libs "$(command -v "$tool")"
done
ln -s useradd "$root/usr/sbin/adduser"  # as shadow-utils installs it on RPM distributions
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\n' >"$root/etc/group"
printf 'root:*:19000:0:99999:7:::\n' >"$root/etc/shadow"
printf 'root:*::\n' >"$root/etc/gshadow"
chmod 0640 "$root/etc/shadow" "$root/etc/gshadow"
host_user="$(getent passwd dltrain || true)"
rpm_root() { rpm --root "$root" "$@" >"$out/rpm.log" 2>&1; }
# rpm reports a failing %post/%preun/%postun as a warning and may still exit 0: any
# warning or error fails the test.
rpm_clean() {
  ! grep -qiE 'warning|error|scriptlet|failed|not found' "$out/rpm.log" || { cat "$out/rpm.log"; fail "$1 reported problems"; }
}
rpm_root --nodeps -i "$rpm" || { cat "$out/rpm.log"; fail "rpm --root -i failed"; }
rpm_clean "rpm --root -i"
rpm --root "$root" -q dltrain >/dev/null || fail "rpm --root -q does not list dltrain after the install"
for f in /usr/bin/dltrain-agent /usr/bin/dltrain /usr/bin/dltrain-ps /usr/bin/dltrain-worker; do
  [[ -x "$root$f" ]] || fail "scratch root lacks executable $f"
done
[[ -f "$root/lib/systemd/system/dltrain-agent.service" ]] || fail "scratch root lacks the unit"
cmp -s "$root/etc/dltrain/agent.toml" "$(dirname "$0")/../../packaging/agent.toml" || fail "scratch root's agent.toml is not the packaged one"
[[ -f "$root/usr/share/dltrain/configs/leader.toml" ]] || fail "scratch root lacks the example configs"
# The user and group were created in the scratch root's databases, not on this machine.
user_line="$(grep '^dltrain:' "$root/etc/passwd")" || fail "no dltrain user in the scratch root's /etc/passwd"
group_line="$(grep '^dltrain:' "$root/etc/group")" || fail "no dltrain group in the scratch root's /etc/group"
IFS=: read -r _ _ uid gid _ home shell <<<"$user_line"
IFS=: read -r _ _ group_gid _ <<<"$group_line"
[[ $uid -gt 0 && $uid -lt 1000 ]] || fail "dltrain is not a system user (uid $uid)"
[[ $gid == "$group_gid" ]] || fail "dltrain's primary group is $gid, the dltrain group is $group_gid"
[[ $home == /var/lib/dltrain && $shell == */nologin ]] || fail "dltrain has home $home and shell $shell"
[[ "$(getent passwd dltrain || true)" == "$host_user" ]] || fail "the scratch-root install changed this machine's users"
# Owners as numbers: names would be looked up in this machine's databases.
[[ $(stat -c '%u:%g %a' "$root/var/lib/dltrain") == "$uid:$gid 750" ]] \
  || fail "state directory is $(stat -c '%u:%g %a' "$root/var/lib/dltrain"), expected $uid:$gid 750"
for t in agent client; do
  f="$root/etc/dltrain/$t.token"
  [[ $(stat -c '%u:%g %a' "$f") == "$uid:$gid 600" ]] || fail "$t.token is $(stat -c '%u:%g %a' "$f"), expected $uid:$gid 600"
  grep -qxE '[0-9a-f]{64}' "$f" || fail "$t.token is not 64 hex digits: $(cat "$f")"
done
! cmp -s "$root/etc/dltrain/agent.token" "$root/etc/dltrain/client.token" || fail "the two tokens are equal"
cp "$root/etc/dltrain/agent.token" "$out/agent.token.first"

# Erase: %preun/%postun succeed; the packaged files go, the user, state and tokens stay.
rpm_root -e dltrain || { cat "$out/rpm.log"; fail "rpm --root -e failed"; }
rpm_clean "rpm --root -e"
! rpm --root "$root" -q dltrain >/dev/null 2>&1 || fail "rpm --root -q still lists dltrain after the erase"
for f in /usr/bin/dltrain-agent /usr/bin/dltrain /lib/systemd/system/dltrain-agent.service /etc/dltrain/agent.toml; do
  [[ ! -e "$root$f" ]] || fail "$f left behind in the scratch root by rpm -e"
done
[[ -d "$root/var/lib/dltrain" && -f "$root/etc/dltrain/agent.token" ]] || fail "rpm -e removed the state or the tokens"

# Reinstall over the kept user and tokens: nothing is created twice, the tokens are kept.
rpm_root --nodeps -i "$rpm" || { cat "$out/rpm.log"; fail "rpm --root -i (again) failed"; }
rpm_clean "rpm --root -i (again)"
[[ $(grep -c '^dltrain:' "$root/etc/passwd") -eq 1 && $(grep '^dltrain:' "$root/etc/passwd") == "$user_line" ]] \
  || fail "the reinstall changed the dltrain user: $(grep '^dltrain:' "$root/etc/passwd")"
cmp -s "$root/etc/dltrain/agent.token" "$out/agent.token.first" || fail "the reinstall replaced agent.token"
rpm_root -e dltrain || { cat "$out/rpm.log"; fail "rpm --root -e (again) failed"; }
rpm_clean "rpm --root -e (again)"

# --- .deb: install
dpkg -i "$deb" >/dev/null || fail "dpkg -i failed"
getent passwd dltrain >/dev/null || fail "no dltrain user"
[[ -d /var/lib/dltrain && $(stat -c %U /var/lib/dltrain) == dltrain ]] || fail "state directory missing or not owned"
[[ -x /usr/bin/dltrain-agent && -f /lib/systemd/system/dltrain-agent.service ]] || fail "binaries or unit missing"
[[ -f /etc/dltrain/agent.toml ]] || fail "config missing"
dpkg-query -W -f='${Conffiles}' dltrain | grep -q /etc/dltrain/agent.toml || fail "agent.toml is not a conffile"
# the Python client, as python3's module (docs/python.md); its Recommends name what it imports
mod="$(cd / && env -u PYTHONPATH /usr/bin/python3 -c 'import dltrain, dltrain.networks; print(dltrain.__file__)')" ||
  fail "python3 cannot import the installed dltrain module"
[[ "$mod" == /usr/lib/python3/dist-packages/dltrain/__init__.py ]] || fail "python3 imports dltrain from $mod"
dpkg-deb -f "$deb" Recommends | grep -q python3-websocket || fail "the .deb does not recommend python3-websocket"
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
