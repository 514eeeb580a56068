"""A "machine" for the tests and benchmarks that lose one (tests/integration/
ha_host_loss_test.py, bench/ha/timing.py): a network namespace joined to the caller's by a
veth pair, 10.231.N.1 on the caller's side and 10.231.N.2 inside, with a default route
back, so that from inside it reaches every address of the caller's namespace (etcd on an
address of its own there, other hosts' outer addresses). Taking it down drops its link first
(packets to it are lost, no connection is reset, as when a machine dies) and then kills
every process in it; bring_up() makes it again with the same addresses, as a repaired
machine. Needs root, iproute2 and nsenter."""
import os
import subprocess


def sh(argv, check=True):
    return subprocess.run(argv, capture_output=True, text=True, check=check)


class Host:
    def __init__(self, index=0):
        """`index` (0-199) tells apart the hosts of one process; the names and the subnet
        also carry the process id, so that two runs side by side do not collide."""
        pid = os.getpid()
        n = (pid * 7 + index * 31) % 200 + 20
        self.ns = "dlth%d-%d" % (pid, index)
        self.veth = "h%d%dr" % (pid % 100000, index)
        self.outside, self.inside = "10.231.%d.1" % n, "10.231.%d.2" % n
        self.wrap = ["nsenter", "--net=/run/netns/" + self.ns]
        self.bring_up()

    def bring_up(self):
        sh(["ip", "netns", "add", self.ns])
        try:
            sh(["ip", "link", "add", self.veth, "type", "veth", "peer", "name", "eth0", "netns", self.ns])
            sh(["ip", "addr", "add", self.outside + "/30", "dev", self.veth])
            sh(["ip", "link", "set", self.veth, "up"])
            sh(["ip", "-n", self.ns, "addr", "add", self.inside + "/30", "dev", "eth0"])
            sh(["ip", "-n", self.ns, "link", "set", "eth0", "up"])
            sh(["ip", "-n", self.ns, "link", "set", "lo", "up"])
            sh(["ip", "-n", self.ns, "route", "add", "default", "via", self.outside])
        except subprocess.CalledProcessError:
            self.delete()
            raise

    def pids(self):
        return [int(p) for p in sh(["ip", "netns", "pids", self.ns], check=False).stdout.split()]

    def take_down(self):
        """The machine is gone: its link first, then everything on it."""
        sh(["ip", "link", "set", self.veth, "down"], check=False)
        self._kill_all()

    def _kill_all(self):
        for pid in self.pids():
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass

    def delete(self):
        self._kill_all()
        sh(["ip", "netns", "delete", self.ns], check=False)
        sh(["ip", "link", "delete", self.veth], check=False)


class Dummy:
    """An address of the caller's namespace (10.230.N.1, on its loopback interface: a
    kernel without the dummy device has one too), reachable from every Host through its
    default route, whichever host is down."""

    def __init__(self):
        pid = os.getpid()
        self.address = "10.230.%d.1" % (pid % 200 + 20)
        sh(["ip", "addr", "add", self.address + "/32", "dev", "lo"])

    def delete(self):
        sh(["ip", "addr", "del", self.address + "/32", "dev", "lo"], check=False)


def missing():
    """Why hosts cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    import shutil
    if not (shutil.which("ip") and shutil.which("nsenter")):
        return "needs ip (iproute2) and nsenter"
    return None
