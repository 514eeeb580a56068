// Checks rendered Kubernetes manifests offline (packaging/kubernetes, docs/kubernetes.md):
// every object against the Kubernetes API's OpenAPI schema (kubernetes-models' validators),
// then what dltrain's pods need to work, which a schema cannot say: probes and Services on
// ports the pods declare, volumes that name objects of the render (or the Secret the docs
// have the user create), the configuration files the containers are given, and with
// --gpu, the GPU requests. Exit status 0 when all hold; otherwise each problem on a line.
//
// Usage: node validate.mjs [--gpu] [--write-configs DIR] RENDERED.yaml
//   RENDERED.yaml: `kubectl kustomize packaging/kubernetes/base` (or overlays/gpu) output.
//   --write-configs DIR: also write each ConfigMap's files (leader.toml, agent.toml) to DIR,
//   for dltrain-agent --check-config (tests/kubernetes/manifests_test.sh).
import { readFileSync, writeFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";

const args = process.argv.slice(2);
const gpu = args.includes("--gpu");
const w = args.indexOf("--write-configs");
const configDir = w >= 0 ? args.splice(w, 2)[1] : undefined;
const file = args.find((a) => !a.startsWith("--"));
if (!file) {
  console.error("usage: node validate.mjs [--gpu] RENDERED.yaml");
  process.exit(2);
}

const problems = [];
const problem = (where, what) => problems.push(`${file}: ${where}: ${what}`);

const docs = parseAllDocuments(readFileSync(file, "utf8"));
const objects = [];
for (const d of docs) {
  if (d.errors.length) {
    problem("YAML", d.errors.map((e) => e.message).join("; "));
    continue;
  }
  const o = d.toJS();
  if (o) objects.push(o);
}

// The schema check: each object by its apiVersion and kind.
for (const o of objects) {
  const where = `${o.kind} ${o.metadata?.name}`;
  const [group, version] = o.apiVersion.includes("/") ? o.apiVersion.split("/") : ["", o.apiVersion];
  const module = group ? `kubernetes-models/${group}/${version}` : `kubernetes-models/${version}`;
  let models;
  try {
    models = await import(module);
  } catch (e) {
    problem(where, `no schema for apiVersion ${o.apiVersion} (${e.message})`);
    continue;
  }
  const Model = models[o.kind];
  if (!Model) {
    problem(where, `${o.apiVersion} has no kind ${o.kind}`);
    continue;
  }
  try {
    new Model(o).validate();
  } catch (e) {
    problem(where, `schema: ${e.message}`);
  }
}

const byKind = (kind) => objects.filter((o) => o.kind === kind);
const one = (kind, name) => objects.find((o) => o.kind === kind && o.metadata.name === name);
const configMaps = byKind("ConfigMap");
const EXTERNAL_SECRET = "dltrain-tokens"; // created by the user (docs/kubernetes.md)

for (const o of objects) {
  if (o.kind !== "Namespace" && o.metadata.namespace !== "dltrain") {
    problem(`${o.kind} ${o.metadata.name}`, `namespace "${o.metadata.namespace}", want "dltrain"`);
  }
}

const leader = one("StatefulSet", "dltrain-leader");
const agents = one("DaemonSet", "dltrain-agent");
if (!leader) problem("StatefulSet dltrain-leader", "missing");
if (!agents) problem("DaemonSet dltrain-agent", "missing");

function containerPorts(podSpec) {
  const ports = new Map();
  for (const c of podSpec.containers) for (const p of c.ports ?? []) ports.set(p.name, p.containerPort);
  return ports;
}

function portOf(ports, ref) {
  return typeof ref === "number" ? ([...ports.values()].includes(ref) ? ref : undefined) : ports.get(ref);
}

// What every dltrain pod needs: probes on declared ports, the metrics port annotated,
// volumes that exist, the configuration file and token files it is given.
function checkPod(workload, wantConfig) {
  const where = `${workload.kind} ${workload.metadata.name}`;
  const tpl = workload.spec.template;
  const spec = tpl.spec;
  const ports = containerPorts(spec);
  const selector = workload.spec.selector.matchLabels;
  for (const [k, v] of Object.entries(selector)) {
    if (tpl.metadata.labels?.[k] !== v) problem(where, `selector ${k}=${v} does not match the pod's labels`);
  }
  const c = spec.containers[0];
  for (const kind of ["livenessProbe", "readinessProbe"]) {
    const probe = c[kind];
    if (!probe?.httpGet) {
      problem(where, `${kind}: missing (an HTTP GET of /healthz)`);
      continue;
    }
    if (probe.httpGet.path !== "/healthz") problem(where, `${kind}: path ${probe.httpGet.path}, want /healthz`);
    if (portOf(ports, probe.httpGet.port) === undefined) {
      problem(where, `${kind}: port ${probe.httpGet.port} is not a port of the container`);
    }
  }
  const ann = tpl.metadata.annotations ?? {};
  if (ann["prometheus.io/scrape"] !== "true") problem(where, "pod not annotated prometheus.io/scrape: \"true\"");
  if (Number(ann["prometheus.io/port"]) !== ports.get("metrics")) {
    problem(where, `prometheus.io/port ${ann["prometheus.io/port"]} is not the metrics port ${ports.get("metrics")}`);
  }
  const volumes = new Map((spec.volumes ?? []).map((v) => [v.name, v]));
  const claims = new Set((workload.spec.volumeClaimTemplates ?? []).map((t) => t.metadata.name));
  for (const ctr of [...(spec.initContainers ?? []), ...spec.containers]) {
    for (const m of ctr.volumeMounts ?? []) {
      if (!volumes.has(m.name) && !claims.has(m.name)) problem(where, `${ctr.name} mounts ${m.name}, which is no volume`);
    }
  }
  for (const v of volumes.values()) {
    if (v.configMap && !configMaps.some((cm) => cm.metadata.name === v.configMap.name)) {
      problem(where, `volume ${v.name}: ConfigMap ${v.configMap.name} is not in the render`);
    }
    if (v.secret && v.secret.secretName !== EXTERNAL_SECRET && !one("Secret", v.secret.secretName)) {
      problem(where, `volume ${v.name}: Secret ${v.secret.secretName} is neither in the render nor ${EXTERNAL_SECRET}`);
    }
  }
  // --config=PATH names a key of the mounted ConfigMap.
  const configArg = (c.args ?? []).find((a) => a.startsWith("--config="));
  if (!configArg) {
    problem(where, "no --config= argument");
    return {};
  }
  const path = configArg.slice("--config=".length);
  const mount = c.volumeMounts.find((m) => path.startsWith(m.mountPath + "/"));
  const cmName = mount && volumes.get(mount.name)?.configMap?.name;
  const cm = configMaps.find((x) => x.metadata.name === cmName);
  const key = mount && path.slice(mount.mountPath.length + 1);
  const text = cm?.data?.[key];
  if (text === undefined) {
    problem(where, `--config=${path} is not a key of a mounted ConfigMap`);
    return {};
  }
  if (key !== wantConfig) problem(where, `runs ${key}, want ${wantConfig}`);
  // The token files it names are in the directory the init container fills from the Secret.
  const tokensMount = c.volumeMounts.find((m) => m.name === "tokens");
  const init = (spec.initContainers ?? []).find((i) => i.name === "tokens");
  for (const m of text.matchAll(/^(\w+_token_file)\s*=\s*"([^"]+)"/gm)) {
    if (!tokensMount || !m[2].startsWith(tokensMount.mountPath + "/")) {
      problem(where, `${key}: ${m[1]} = "${m[2]}" is outside the tokens volume`);
    }
  }
  if (!init || !init.volumeMounts.some((m) => m.name === "tokens" && m.mountPath === tokensMount?.mountPath)) {
    problem(where, "no init container copying the tokens (0600) into the tokens volume");
  }
  for (const name of ["--name=", "--advertise-address="]) {
    if (!(c.args ?? []).some((a) => a.startsWith(name + "$("))) problem(where, `no ${name}$(…) from the downward API`);
  }
  return { text, ports };
}

if (leader) {
  if (leader.spec.replicas !== 1) problem("StatefulSet dltrain-leader", `replicas ${leader.spec.replicas}, want 1`);
  const { text, ports } = checkPod(leader, "leader.toml");
  const state = leader.spec.template.spec.containers[0].volumeMounts.find((m) => m.name === "state");
  if (!state || state.mountPath !== "/var/lib/dltrain" ||
      !(leader.spec.volumeClaimTemplates ?? []).some((t) => t.metadata.name === "state")) {
    problem("StatefulSet dltrain-leader", "its state (/var/lib/dltrain) is not on a persistent volume claim");
  }
  if (text && !/^leader = true$/m.test(text)) problem("StatefulSet dltrain-leader", "leader.toml lacks leader = true");
  const port = text && Number(text.match(/^listen_port = (\d+)/m)?.[1]);
  if (ports && port !== ports.get("control")) {
    problem("StatefulSet dltrain-leader", `listen_port ${port} is not the container's control port ${ports?.get("control")}`);
  }
  const svc = one("Service", "dltrain-leader");
  if (!svc) {
    problem("Service dltrain-leader", "missing");
  } else {
    for (const [k, v] of Object.entries(svc.spec.selector)) {
      if (leader.spec.template.metadata.labels[k] !== v) problem("Service dltrain-leader", `selector ${k}=${v} selects no leader pod`);
    }
    for (const p of svc.spec.ports) {
      if (ports && portOf(ports, p.targetPort) === undefined) {
        problem("Service dltrain-leader", `targetPort ${p.targetPort} is not a port of the leader pod`);
      }
    }
  }
  if (!one("Service", leader.spec.serviceName)) problem("StatefulSet dltrain-leader", `serviceName ${leader.spec.serviceName} is no Service`);
}

if (agents) {
  const { text } = checkPod(agents, "agent.toml");
  const spec = agents.spec.template.spec;
  if (spec.nodeSelector?.["dltrain.io/agent"] !== "true") problem("DaemonSet dltrain-agent", "not limited to nodes labelled dltrain.io/agent=true");
  const url = text?.match(/^leader_url = "ws:\/\/([^:]+):(\d+)"/m);
  const svc = url && one("Service", url[1]);
  if (!svc || !svc.spec.ports.some((p) => p.port === Number(url[2]))) {
    problem("DaemonSet dltrain-agent", `leader_url ${url ? url[0] : "(none)"} is not the leader Service's port`);
  }
  const limits = spec.containers[0].resources?.limits ?? {};
  if (gpu) {
    if (!(Number(limits["nvidia.com/gpu"]) > 0)) problem("DaemonSet dltrain-agent", "requests no nvidia.com/gpu");
    if (spec.nodeSelector?.["nvidia.com/gpu.present"] !== "true") problem("DaemonSet dltrain-agent", "not limited to GPU nodes");
    if (!(spec.tolerations ?? []).some((t) => t.key === "nvidia.com/gpu")) problem("DaemonSet dltrain-agent", "does not tolerate nvidia.com/gpu");
    if (text && !/^hardware_class = "gpu"$/m.test(text)) problem("DaemonSet dltrain-agent", "agent.toml's hardware_class is not \"gpu\"");
    if (text && !/^gpus = "auto"$/m.test(text)) problem("DaemonSet dltrain-agent", "agent.toml does not offer the GPUs it sees");
  } else if (limits["nvidia.com/gpu"] !== undefined) {
    problem("DaemonSet dltrain-agent", "the base requests GPUs (that is overlays/gpu's)");
  }
}

if (configDir) {
  for (const cm of configMaps) for (const [k, v] of Object.entries(cm.data ?? {})) writeFileSync(`${configDir}/${k}`, v);
}

if (problems.length) {
  for (const p of problems) console.error(p);
  process.exit(1);
}
console.log(`${file}: ${objects.length} objects valid (${objects.map((o) => o.kind).join(", ")})`);
