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


class Lan:
    """Hosts on one bridge of the caller's namespace, as machines on one switch: host i is
    a network namespace with 10.232.M.(10+i)/24 on its end of a veth pair whose other end
    is a port of the bridge, which holds 10.232.M.1 (`leader_address`: a daemon of the
    caller's namespace listens there). With `rate` (tc's form, "100mbit"), every host's link
    is limited by a token bucket (tc tbf) in both directions, as a NIC of that speed. The
    hosts reach each other over the bridge without forwarding. delete() removes it all."""

    def __init__(self, hosts, rate=None):
        pid = os.getpid()
        m = (pid * 13) % 200 + 20
        self.bridge = "dlb%d" % (pid % 100000)
        self.subnet = "10.232.%d" % m
        self.leader_address = self.subnet + ".1"
        self.names = ["dlln%d-%d" % (pid, i) for i in range(hosts)]
        self.ports = ["l%d%dp" % (pid % 100000, i) for i in range(hosts)]
        self.rate = rate
        try:
            sh(["ip", "link", "add", self.bridge, "type", "bridge"])
            sh(["ip", "addr", "add", self.leader_address + "/24", "dev", self.bridge])
            sh(["ip", "link", "set", self.bridge, "up"])
            for i, (ns, port) in enumerate(zip(self.names, self.ports)):
                sh(["ip", "netns", "add", ns])
                sh(["ip", "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns])
                sh(["ip", "link", "set", port, "master", self.bridge])
                sh(["ip", "link", "set", port, "up"])
                sh(["ip", "-n", ns, "addr", "add", self.address(i) + "/24", "dev", "eth0"])
                sh(["ip", "-n", ns, "link", "set", "eth0", "up"])
                sh(["ip", "-n", ns, "link", "set", "lo", "up"])
                if rate:
                    tbf = ["root", "tbf", "rate", rate, "burst", "256kbit", "latency", "100ms"]
                    sh(["tc", "qdisc", "add", "dev", port] + tbf)
                    sh(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0"] + tbf)
        except subprocess.CalledProcessError:
            self.delete()
            raise

    def address(self, i):
        return "%s.%d" % (self.subnet, 10 + i)

    def wrap(self, i):
        """The command prefix that runs a program on host i."""
        return ["nsenter", "--net=/run/netns/" + self.names[i]]

    def delete(self):
        for ns in self.names:
            for pid in sh(["ip", "netns", "pids", ns], check=False).stdout.split():
                try:
                    os.kill(int(pid), 9)
                except ProcessLookupError:
                    pass
            sh(["ip", "netns", "delete", ns], check=False)
        for port in self.ports:
            sh(["ip", "link", "delete", port], check=False)
        sh(["ip", "link", "delete", self.bridge], check=False)


def missing():
    """Why hosts cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    import shutil
    if not (shutil.which("ip") and shutil.which("nsenter") and shutil.which("tc")):
        return "needs ip and tc (iproute2) and nsenter"
    return None
