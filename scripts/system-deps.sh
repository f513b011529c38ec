#!/bin/sh
# System packages the integration tests use: a real sshd, systemd-journal-remote (to build journal files),
# journalctl, promtool (Debian's prometheus package: the alert rules are tested with it; policy-rc.d below keeps
# the server from starting), and what systemd-python needs to build. Installed when missing and running as root with apt;
# otherwise this says what is missing, and the tests that need it are skipped with the same reason.
missing=""
[ -x /usr/sbin/sshd ] || missing="$missing openssh-server"
[ -x /usr/lib/systemd/systemd-journal-remote ] || [ -x /lib/systemd/systemd-journal-remote ] || missing="$missing systemd-journal-remote"
command -v journalctl >/dev/null 2>&1 || missing="$missing systemd"
command -v ssh-keygen >/dev/null 2>&1 || missing="$missing openssh-client"
command -v pkg-config >/dev/null 2>&1 || missing="$missing pkg-config"
pkg-config --exists libsystemd 2>/dev/null || missing="$missing libsystemd-dev"
command -v cc >/dev/null 2>&1 || missing="$missing gcc"
command -v promtool >/dev/null 2>&1 || missing="$missing prometheus"
py=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null)
[ -f "$py/Python.h" ] || missing="$missing python3-dev"
[ -z "$missing" ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing test dependencies:$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null 2>&1 || true
  # policy-rc.d keeps the packages from starting a system sshd on port 22 or a Prometheus server
  if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; added=1; fi
  apt-get install -y -qq --no-install-recommends $missing >/dev/null || echo "WARNING: apt-get install$missing failed"
  [ -n "${added:-}" ] && rm -f /usr/sbin/policy-rc.d
else
  echo "NOTE: missing for the integration tests:$missing (install them, as root: apt-get install$missing);"
  echo "      the tests that need them will be skipped."
fi
exit 0
