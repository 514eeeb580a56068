// Drives the leader's dashboard in Debian's headless Chromium for
// tests/integration/dashboard_test.cpp, over the Chrome DevTools protocol on a pipe
// (--remote-debugging-pipe: NUL-terminated JSON on file descriptors 3 and 4), so that it
// needs nothing but Node and Chromium — no npm package, no network.
//
// Usage: node dashboard_browser.mjs CONFIG.json
//   CONFIG: {"url", "token", "job", "out" (screenshot directory), "chromium",
//            "straggler" (a task to wait for its straggler flag, or ""),
//            "tmp" (where Chromium's throw-away profile goes; default: the system's),
//            "plan_job" (an automatic job whose planner decision to read once it
//            succeeded, or ""), "elastic_job" (an elastic job whose start by the shared
//            plan to read from the shared plan's section, or "")}
// Writes one JSON line per phase to stdout ({"phase": ...}; the last one, "done", also has
// "page_errors": what the page logged as errors); the test reads them, acts
// (stops and continues a worker) and asserts on the figures. Every wait is bounded; on a
// timeout it writes {"phase":"error", "message"} and exits 1.
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const cfg = JSON.parse(readFileSync(process.argv[2], "utf8"));
const say = (o) => process.stdout.write(JSON.stringify(o) + "\n");
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const profile = mkdtempSync(join(cfg.tmp || tmpdir(), "dltrain-chromium-"));
const chrome = spawn(cfg.chromium, [
  "--headless=new", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu", "--no-first-run",
  "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
  "--disable-component-update", "--disable-sync", "--metrics-recording-only", "--mute-audio",
  `--user-data-dir=${profile}`, "--window-size=1400,1000", "about:blank",
], { stdio: ["ignore", "ignore", "pipe", "pipe", "pipe"], detached: true });  // its own process group
let chromeLog = "";
chrome.stderr.on("data", (d) => { chromeLog = (chromeLog + d).slice(-4000); });

// ------------------------------------------------------------ the protocol
let nextId = 1;
const waiting = new Map();
// What the page reported as errors: exceptions, console.error, failed loads and
// Content-Security-Policy violations (Log domain, level "error").
const pageErrors = [];
let inbuf = Buffer.alloc(0);
chrome.stdio[4].on("data", (chunk) => {
  inbuf = Buffer.concat([inbuf, chunk]);
  let end;
  while ((end = inbuf.indexOf(0)) >= 0) {
    const msg = JSON.parse(inbuf.subarray(0, end).toString("utf8"));
    inbuf = inbuf.subarray(end + 1);
    if (msg.method === "Log.entryAdded" && msg.params.entry.level === "error") {
      pageErrors.push(`${msg.params.entry.source}: ${msg.params.entry.text} ${msg.params.entry.url || ""}`);
    } else if (msg.method === "Runtime.exceptionThrown") {
      const d = msg.params.exceptionDetails;
      pageErrors.push(`exception: ${d.exception ? d.exception.description : d.text}`);
    } else if (msg.method === "Runtime.consoleAPICalled" && msg.params.type === "error") {
      pageErrors.push(`console.error: ${msg.params.args.map((a) => a.value ?? a.description).join(" ")}`);
    }
    if (msg.id && waiting.has(msg.id)) {
      const { resolve, reject } = waiting.get(msg.id);
      waiting.delete(msg.id);
      if (msg.error) reject(new Error(`${msg.error.message} (${msg.error.code})`));
      else resolve(msg.result);
    }
  }
});
function send(method, params = {}, sessionId) {
  const id = nextId++;
  const msg = { id, method, params };
  if (sessionId) msg.sessionId = sessionId;
  return new Promise((resolve, reject) => {
    waiting.set(id, { resolve, reject });
    chrome.stdio[3].write(JSON.stringify(msg) + "\0");
  });
}

let session;
const cmd = (method, params) => send(method, params, session);
async function evaluate(expr) {
  const r = await cmd("Runtime.evaluate", { expression: expr, returnByValue: true, awaitPromise: true });
  if (r.exceptionDetails) throw new Error("page: " + (r.exceptionDetails.exception?.description || r.exceptionDetails.text));
  return r.result.value;
}
async function waitFor(what, expr, timeoutMs) {
  const until = Date.now() + timeoutMs;
  for (;;) {
    const v = await evaluate(expr);
    if (v) return v;
    if (Date.now() > until) throw new Error(`timed out after ${timeoutMs / 1000} s waiting for ${what}`);
    await sleep(250);
  }
}
let shots = 0;
async function screenshot(name) {
  const { data } = await cmd("Page.captureScreenshot", { format: "png", captureBeyondViewport: true });
  const file = join(cfg.out, `${String(++shots).padStart(2, "0")}-${name}.png`);
  writeFileSync(file, Buffer.from(data, "base64"));
  return file;
}
async function loadPage() {
  await cmd("Page.navigate", { url: cfg.url });
  await waitFor("the page to load and start", `document.readyState === "complete" &&
    !!document.getElementById("login") && document.body.dataset.started === "true"`, 30000);
}

// What the page shows: the text and what the test counts.
const SNAPSHOT = `(() => {
  const q = (s) => document.querySelector(s);
  const points = (id) => Number((q("#" + id) || { dataset: {} }).dataset.points || 0);
  const acc = q("#job-accuracy");
  return {
    text: document.body.innerText,
    login_visible: !q("#login").hidden,
    main_hidden: q("#main").hidden,
    main_elements: q("#main").querySelectorAll("*").length,
    agent_rows: document.querySelectorAll("#agents-table tbody tr").length,
    agent_names: [...document.querySelectorAll("#agents-table tbody tr")].map((r) => r.dataset.agent),
    job_rows: document.querySelectorAll("#jobs-table tbody tr").length,
    job_state: (q("#job-state") || {}).textContent || "",
    job_title: (q("#job-title") || {}).textContent || "",
    points: { loss: points("chart-loss"), ips: points("chart-ips"), bytes: points("chart-bytes"),
              accuracy: points("chart-accuracy") },
    canvases: document.querySelectorAll("#job .chart canvas").length,  // the selected job's charts
    all_canvases: document.querySelectorAll("canvas").length,
    accuracy_text: acc ? acc.textContent : "",
    accuracy_value: acc && acc.dataset.value !== undefined ? JSON.parse(acc.dataset.value) : null,
    stragglers: [...document.querySelectorAll("#tasks-table tr.task-row")]
      .filter((r) => r.querySelector(".badge.straggler")).map((r) => r.dataset.task),
    events: document.querySelectorAll("#events-table tbody tr").length,
    model_command: (q(".card.model code") || {}).textContent || "",
    token_stored: sessionStorage.getItem("dltrain.client_token") !== null,
  };
})()`;
const snapshot = () => evaluate(SNAPSHOT);
const submitToken = (t) => evaluate(`(() => { document.getElementById("token").value = ${JSON.stringify(t)};
  document.getElementById("login").requestSubmit(); return true; })()`);

async function main() {
  const { targetInfos } = await send("Target.getTargets");
  const page = targetInfos.find((t) => t.type === "page");
  if (!page) throw new Error("Chromium opened no page");
  ({ sessionId: session } = await send("Target.attachToTarget", { targetId: page.targetId, flatten: true }));
  await cmd("Page.enable");
  await cmd("Runtime.enable");
  await cmd("Log.enable");
  await cmd("Emulation.setDeviceMetricsOverride", { width: 1400, height: 1000, deviceScaleFactor: 1, mobile: false });

  // 1. No token: the login form and nothing else; a wrong token changes nothing.
  await loadPage();  // started: without a stored token it has done all it does
  const before = await snapshot();
  const shotLogin = await screenshot("login");
  await submitToken("not-the-token");
  await waitFor("the refusal", `document.getElementById("login-error").textContent.length > 0`, 15000);
  const wrong = await snapshot();
  wrong.error = await evaluate(`document.getElementById("login-error").textContent`);
  const shotWrong = await screenshot("wrong-token");
  say({ phase: "login", before, wrong, screenshots: [shotLogin, shotWrong] });

  // 2. The token: agents, jobs, the job's curves growing while it runs.
  await submitToken(cfg.token);
  await waitFor("the agents table", `document.querySelectorAll("#agents-table tbody tr").length > 0`, 15000);
  await waitFor("the job's row", `!!document.querySelector('tr.job-row[data-job="${cfg.job}"]')`, 15000);
  await evaluate(`document.querySelector('tr.job-row[data-job="${cfg.job}"]').click(), true`);
  await waitFor("two points on the loss curve", `(() => { const t = document.getElementById("job-title");
    const c = document.getElementById("chart-loss");
    return t && t.textContent.startsWith(${JSON.stringify(cfg.job + ":")}) && c && Number(c.dataset.points) >= 2; })()`,
  180000);
  const first = await snapshot();
  const shotA = await screenshot("running-a");
  // Until no worker is flagged: at the start the worker launched last is briefly behind
  // (the leader's straggler rule), and the flag checked below must be the stop's.
  await waitFor("more points on the loss curve and no straggler flagged", `Number(
    document.getElementById("chart-loss").dataset.points) >= ${first.points.loss + 3} &&
    !document.querySelector("#tasks-table .badge.straggler")`, 120000);
  const second = await snapshot();
  const shotB = await screenshot("running-b");
  say({ phase: "grown", first, second, screenshots: [shotA, shotB] });

  // 3. A straggler (the test stops that worker now) is flagged.
  if (cfg.straggler) {
    await waitFor(`${cfg.straggler}'s straggler flag`, `[...document.querySelectorAll("#tasks-table tr.task-row")]
      .some((r) => r.dataset.task === ${JSON.stringify(cfg.straggler)} && r.querySelector(".badge.straggler"))`,
    180000);
    const flagged = await snapshot();
    const shotS = await screenshot("straggler");
    say({ phase: "straggler", flagged, screenshots: [shotS] });
  }

  // 4. The job finished: its final accuracy as shown.
  await waitFor("the job to succeed", `(document.getElementById("job-state") || {}).textContent === "succeeded" &&
    document.getElementById("job-accuracy").dataset.value !== undefined`, 400000);
  await waitFor("the last refresh of the curves and the event log", `Number(
    document.getElementById("chart-accuracy").dataset.points) >= ${cfg.epochs} &&
    document.querySelectorAll("#events-table tbody tr").length > 0`, 60000);
  const done = await snapshot();
  const shotD = await screenshot("finished");

  // 5. A reload keeps the session (the token is in sessionStorage).
  await loadPage();
  await waitFor("the agents table after a reload", `document.querySelectorAll("#agents-table tbody tr").length > 0`,
    15000);
  const reloaded = await snapshot();

  // 6. The planner's decision of an automatic job, as its table shows it.
  let plan = null;
  const shots = [shotD];
  if (cfg.plan_job) {
    await waitFor("the automatic job's row", `!!document.querySelector('tr.job-row[data-job="${cfg.plan_job}"]')`,
      300000);
    await evaluate(`document.querySelector('tr.job-row[data-job="${cfg.plan_job}"]').click(), true`);
    await waitFor("the automatic job to succeed with its plan", `(() => {
      const t = document.getElementById("job-title"), s = document.getElementById("job-state");
      return t && t.textContent.startsWith(${JSON.stringify(cfg.plan_job + ":")}) && s &&
        s.textContent === "succeeded" && document.querySelectorAll("#plan-table tbody tr").length > 0; })()`,
    300000);
    // The plan table is built from one status reply in one go: once it has rows, it is whole.
    plan = await evaluate(`(() => ({
      explanation: document.getElementById("plan-explanation").textContent,
      rows: [...document.querySelectorAll("#plan-table tbody tr")].map((r) => {
        const c = [...r.cells].map((x) => x.textContent);
        return { rank: Number(c[0]), workers: Number(c[1]), batch_size: Number(c[2]), feasible: c[6],
                 reason: c[7], chosen: r.classList.contains("chosen") };
      }),
    }))()`);
    shots.push(await screenshot("plan"));
  }
  // 7. The shared plan's section: the elastic job's start among its latest changes, and
  // the chart of each job's workers.
  let shared = null;
  if (cfg.elastic_job) {
    await waitFor("the shared plan to start the elastic job",
      `!!document.querySelector('#plan-changes li[data-job="${cfg.elastic_job}"]')`, 300000);
    shared = await evaluate(`(() => ({
      visible: !document.getElementById("plan-section").hidden,
      changes: [...document.querySelectorAll('#plan-changes li[data-job="${cfg.elastic_job}"]')].map((l) => l.textContent),
      chart_points: Number(document.getElementById("chart-shares").dataset.points),
      chart_canvas: !!document.querySelector("#chart-shares canvas"),
    }))()`);
    shots.push(await screenshot("shared-plan"));
  }
  say({ phase: "done", done, reloaded, plan, shared, screenshots: shots, page_errors: pageErrors });
}

const timer = setTimeout(() => { say({ phase: "error", message: "the whole run took over 15 minutes" }); finish(1); },
  15 * 60 * 1000);
// Chromium and its helper processes (renderer, GPU, crash handler: its process group)
// are killed, and the browser reaped, before its profile is removed; a helper that still
// writes there for a moment makes the removal retry, and a profile left behind is the
// test's temporary directory's to remove: the run's result stands either way.
function finish(code) {
  clearTimeout(timer);
  const done = () => {
    try {
      process.kill(-chrome.pid, "SIGKILL");
    } catch {
      // the group is gone already
    }
    try {
      rmSync(profile, { recursive: true, force: true, maxRetries: 20, retryDelay: 100 });
    } catch (e) {
      process.stderr.write(`dashboard_browser: the profile ${profile} stays: ${e.message}\n`);
    }
    process.exit(code);
  };
  if (chrome.exitCode !== null || chrome.signalCode !== null) return done();
  chrome.removeAllListeners("exit");
  chrome.on("exit", done);
  try {
    process.kill(-chrome.pid, "SIGKILL");
  } catch {
    chrome.kill("SIGKILL");
  }
}
chrome.on("exit", (code, signal) => {
  say({ phase: "error", message: `chromium exited (${code ?? signal}): ${chromeLog}` });
  finish(1);
});
main().then(() => finish(0), (e) => { say({ phase: "error", message: e.message, chromium: chromeLog }); finish(1); });
