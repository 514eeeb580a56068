"""Finding the leader and the client token, in the order the `dltrain` command uses
(client/leader_target.h): each setting from the first place that sets it.

1. the arguments (`Client(leader=..., token=..., ca_file=...)`);
2. the environment: DLTRAIN_LEADER, DLTRAIN_TOKEN, DLTRAIN_CA_FILE;
3. the client configurations, in order $DLTRAIN_CLIENT_CONFIG,
   $XDG_CONFIG_HOME/dltrain/client.toml (XDG_CONFIG_HOME defaults to $HOME/.config),
   /etc/dltrain/client.toml: keys `leader`, `token` or `token_file` (a file whose first
   line is the token, read only when no earlier place set the token) and `ca_file`
   (relative to the configuration file);
4. the file a local standalone cluster (`dltrain-agent --standalone`) writes:
   $XDG_STATE_HOME/dltrain/standalone.json (XDG_STATE_HOME defaults to
   $HOME/.local/state), with `leader` and `client_token`.
"""
import json
import os
import tomllib
import urllib.parse
from dataclasses import dataclass

from .errors import ConfigError


@dataclass
class Target:
    """Where the requests go. `leader` is one ws:// or wss:// URL or, with HA, the
    candidates' URLs separated by commas; `source` and `token_source` say where the leader
    and the token came from ("arguments", "environment" or a file's path), for messages."""

    leader: str = ""
    token: str = ""
    ca_file: str = ""
    source: str = "arguments"
    token_source: str = "arguments"

    @property
    def urls(self):
        """The leader URLs, blanks around each dropped. Raises ConfigError for an empty one."""
        urls = [u.strip() for u in self.leader.split(",")]
        if not urls or any(not u for u in urls):
            raise ConfigError("an empty URL in the leader setting %r (from %s)" % (self.leader, self.source),
                              field="leader")
        for u in urls:
            check_url(u, self.source)
        return urls


def check_url(url, source):
    """Raises ConfigError (field "leader") unless `url` is ws://HOST:PORT or
    wss://HOST:PORT (port 1-65535, no path but "/"), as the CLI's leader URLs must be."""
    why = None
    try:
        u = urllib.parse.urlsplit(url)
        port = u.port
    except ValueError as e:
        why = str(e)
    else:
        if u.scheme not in ("ws", "wss"):
            why = "the scheme must be ws or wss"
        elif not u.hostname:
            why = "it names no host"
        elif port is None or not 1 <= port <= 65535:
            why = "it needs a port, 1-65535"
        elif u.path not in ("", "/") or u.query or u.fragment:
            why = "it has a path; the leader's endpoints are its own"
    if why:
        raise ConfigError("leader URL %r (from %s) is not ws://HOST:PORT or wss://HOST:PORT: %s" % (url, source, why),
                          field="leader")


def _home():
    return os.environ.get("HOME") or "/root"


def client_configs():
    """The client configuration files to look at, most specific first (they need not exist)."""
    paths = []
    if os.environ.get("DLTRAIN_CLIENT_CONFIG"):
        paths.append(os.environ["DLTRAIN_CLIENT_CONFIG"])
    xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.join(_home(), ".config")
    paths.append(os.path.join(xdg, "dltrain", "client.toml"))
    paths.append("/etc/dltrain/client.toml")
    return paths


def standalone_file():
    """$XDG_STATE_HOME/dltrain/standalone.json, where a standalone cluster writes its leader
    and client token."""
    xdg = os.environ.get("XDG_STATE_HOME") or os.path.join(_home(), ".local", "state")
    return os.path.join(xdg, "dltrain", "standalone.json")


def _read_token_file(config, path):
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read().split("\n", 1)[0]
    except OSError as e:
        raise ConfigError("client config %s: cannot read token file %r: %s" % (config, path, e.strerror),
                          field="token_file") from None
    if not token:
        raise ConfigError("client config %s: token file %r has an empty first line" % (config, path), field="token_file")
    return token


def find_leader(leader=None, token=None, ca_file=None):
    """The Target from the arguments, the environment, the client configurations and the
    standalone cluster's file (module docstring). Raises ConfigError naming the file for a
    configuration that is not TOML, a key of the wrong type, a token file that cannot be
    read, a standalone file that is not JSON; and naming the field when nothing sets the
    leader or the token."""
    t = Target(leader or "", token or "", ca_file or "", "arguments", "arguments")
    if not t.ca_file and os.environ.get("DLTRAIN_CA_FILE"):
        t.ca_file = os.environ["DLTRAIN_CA_FILE"]

    def fill(leader, token, source):
        if not t.leader and leader:
            t.leader, t.source = leader, source
        if not t.token and token:
            t.token, t.token_source = token, source

    fill(os.environ.get("DLTRAIN_LEADER", ""), os.environ.get("DLTRAIN_TOKEN", ""), "environment")
    for path in client_configs():
        if not os.path.exists(path):
            continue
        try:
            with open(path, "rb") as f:
                table = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise ConfigError("client config %s: %s" % (path, e)) from None

        def key(k):
            v = table.get(k, "")
            if not isinstance(v, str):
                raise ConfigError("client config %s: %s must be a string, not %s" % (path, k, type(v).__name__), field=k)
            return v

        tok = key("token")
        if not tok and not t.token and key("token_file"):
            tok = _read_token_file(path, key("token_file"))
        fill(key("leader"), tok, path)
        if not t.ca_file and key("ca_file"):
            t.ca_file = os.path.join(os.path.dirname(os.path.abspath(path)), key("ca_file"))
    sa = standalone_file()
    if os.path.exists(sa):
        try:
            with open(sa, encoding="utf-8") as f:
                j = json.load(f)
        except (OSError, ValueError):
            raise ConfigError("standalone client file %s is not valid JSON" % sa) from None
        if not isinstance(j, dict) or not all(isinstance(j.get(k, ""), str) for k in ("leader", "client_token")):
            raise ConfigError("standalone client file %s is not an object with the strings leader and client_token" % sa)
        fill(j.get("leader", ""), j.get("client_token", ""), sa)
    if not t.leader:
        raise ConfigError("no leader configured: pass leader=\"ws://HOST:PORT\", set DLTRAIN_LEADER, write "
                          "~/.config/dltrain/client.toml, or start a local cluster with `dltrain-agent --standalone`",
                          field="leader")
    if not t.token:
        raise ConfigError("no client token for %s: pass token=..., set DLTRAIN_TOKEN or put token in the client config"
                          % t.leader, field="token")
    return t
