// The leader's dashboard (docs/operations.md, "Dashboard"). Talks to the leader over the
// WebSocket /v1/dashboard of the page's own origin: the first message is `auth` with the
// client token (kept in sessionStorage, so it lasts as long as the tab), then the client
// protocol's list, agents, status and follow, and the dashboard's series and events
// (docs/protocol.md). Nothing is shown before the leader accepted the token.
"use strict";

(() => {
  const TOKEN_KEY = "dltrain.client_token";
  const POLL_MS = 2000;       // list and agents
  const REFRESH_MS = 1000;    // the selected job's status, curves and events, at most this often
  const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];

  let ws = null;
  let nextId = 1;
  const pending = new Map();  // request id -> {resolve, reject}
  let pollTimer = null;
  let selected = null;        // job id
  let followed = new Set();   // jobs this session follows
  let refreshDue = false, refreshTimer = null, lastRefresh = 0;
  let charts = {};            // chart id -> {plot, key}
  let jobs = [], agents = [];

  const $ = (id) => document.getElementById(id);
  const el = (tag, attrs = {}, ...children) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (k === "class") e.className = v;
      else if (k === "dataset") Object.assign(e.dataset, v);
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v);
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  };

  // ------------------------------------------------------------ formatting
  const fmtSeconds = (s) => {
    if (s === null || s === undefined || !isFinite(s)) return "–";
    s = Math.round(s);
    const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), x = s % 60;
    return h ? `${h} h ${m} min` : m ? `${m} min ${x} s` : `${x} s`;
  };
  const fmtAccuracy = (a) => (typeof a === "number" ? (a * 100).toFixed(2) + " %" : "–");
  const fmtBytes = (b) => {
    if (typeof b !== "number") return "–";
    const u = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (b >= 1024 && i < u.length - 1) { b /= 1024; ++i; }
    return (i ? b.toFixed(1) : b) + " " + u[i];
  };
  const fmtNum = (x, d = 1) => (typeof x === "number" ? x.toFixed(d) : "–");

  // ------------------------------------------------------------ connection
  function wsUrl() {
    return (location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/v1/dashboard";
  }

  function request(type, body = {}) {
    return new Promise((resolve, reject) => {
      if (!ws || ws.readyState !== WebSocket.OPEN) return reject(new Error("not connected"));
      const id = "d" + nextId++;
      pending.set(id, { resolve, reject });
      ws.send(JSON.stringify({ v: 1, id, type, body }));
    });
  }

  function setConn(text, cls) {
    $("conn").textContent = text;
    $("conn").className = "conn " + (cls || "");
  }

  function connect(token) {
    return new Promise((resolve, reject) => {
      let authed = false;
      const s = new WebSocket(wsUrl());
      ws = s;
      s.onopen = () => {
        const id = "auth";
        pending.set(id, {
          resolve: () => { authed = true; resolve(); },
          reject: (e) => reject(e),
        });
        s.send(JSON.stringify({ v: 1, id, type: "auth", body: { token } }));
      };
      s.onmessage = (m) => onMessage(m.data);
      s.onerror = () => {};
      s.onclose = () => {
        for (const [, p] of pending) p.reject(new Error("connection closed"));
        pending.clear();
        if (ws === s) ws = null;
        if (!authed) return reject(new Error("the leader closed the connection"));
        setConn("disconnected: reconnecting…", "bad");
        stopPolling();
        setTimeout(() => {
          const t = sessionStorage.getItem(TOKEN_KEY);
          if (t) signIn(t, true);
        }, 2000);
      };
    });
  }

  function onMessage(text) {
    let m;
    try { m = JSON.parse(text); } catch { return; }
    if (m.type === "reply") {
      const p = pending.get(m.id);
      if (!p) return;
      pending.delete(m.id);
      if (m.ok) p.resolve(m.body);
      else p.reject(Object.assign(new Error(m.error ? m.error.message : "error"), { code: m.error && m.error.code }));
    } else if (m.type === "event" && m.body) {
      onEvent(m.body);
    }
  }

  // A followed job's event: its figures changed; refresh what shows them.
  function onEvent(ev) {
    if (ev.job && ev.job === selected) scheduleRefresh();
    if (ev.event === "state" || ev.event === "summary") poll();
  }

  // ------------------------------------------------------------ sign in / out
  async function signIn(token, quiet) {
    $("login-error").textContent = "";
    setConn("connecting…", "");
    try {
      await connect(token);
    } catch (e) {
      setConn("", "");
      showLogin();
      if (e.code === "unauthorized" || !quiet) {
        // A wrong token is forgotten; an unreachable leader is tried again.
        sessionStorage.removeItem(TOKEN_KEY);
        $("login-error").textContent = (e.code === "unauthorized" ? "refused: " : "cannot reach the leader: ") +
          e.message;
      } else {
        $("login-error").textContent = "cannot reach the leader: " + e.message + "; retrying";
        setTimeout(() => { const t = sessionStorage.getItem(TOKEN_KEY); if (t) signIn(t, true); }, 3000);
      }
      return;
    }
    sessionStorage.setItem(TOKEN_KEY, token);
    setConn("connected", "good");
    followed = new Set();
    showMain();
    await poll();
    if (selected) selectJob(selected);
    startPolling();
  }

  function signOut() {
    sessionStorage.removeItem(TOKEN_KEY);
    stopPolling();
    if (ws) { const s = ws; ws = null; s.onclose = null; s.close(); }
    selected = null;
    showLogin();
    setConn("", "");
  }

  function showLogin() {
    destroyCharts();
    $("main").replaceChildren();
    $("main").hidden = true;
    $("logout").hidden = true;
    $("login").hidden = false;
  }

  function showMain() {
    $("login").hidden = true;
    $("logout").hidden = false;
    $("token").value = "";
    const main = $("main");
    main.replaceChildren(
      el("p", { id: "leader", hidden: true }),
      el("section", { id: "agents-section" }, el("h2", {}, "Agents"), el("div", { id: "agents" })),
      el("section", { id: "jobs-section" }, el("h2", {}, "Jobs"), el("div", { id: "jobs" })),
      el("section", { id: "plan-section", hidden: "" }, el("h2", {}, "Shared plan"), el("div", { id: "cluster-plan" }),
        chartBox("chart-shares", "workers of each elastic job (the plan's changes; 0 s = now)"),
        el("h3", {}, "Latest changes"), el("ol", { id: "plan-changes", reversed: "" })),
      el("section", { id: "job" }));
    main.hidden = false;
  }

  function startPolling() {
    stopPolling();
    pollTimer = setInterval(poll, POLL_MS);
  }
  function stopPolling() {
    if (pollTimer) clearInterval(pollTimer);
    pollTimer = null;
  }

  async function poll() {
    try {
      const [a, l] = await Promise.all([request("agents"), request("list", { limit: 200 })]);
      agents = a.agents || [];
      jobs = l.jobs || [];
      renderLeader(a.leader);
      renderAgents();
      renderJobs();
      // The shared plan (docs/operations.md "The shared plan"); a leader without the
      // request (an older HA candidate) leaves the section hidden.
      request("cluster_plan").then(renderClusterPlan, () => renderClusterPlan(null));
      if (!selected && jobs.length) {
        const running = jobs.filter((j) => !["succeeded", "failed", "cancelled"].includes(j.state));
        selectJob((running.length ? running[running.length - 1] : jobs[jobs.length - 1]).job);
      }
    } catch (e) {
      // a closed connection reconnects by itself
    }
  }

  // ------------------------------------------------------------ agents and jobs tables
  function table(id, headers, rows) {
    return el("table", { id },
      el("thead", {}, el("tr", {}, ...headers.map((h) => el("th", {}, h)))),
      el("tbody", {}, ...rows));
  }

  // With HA (docs/ha.md): which candidate serves, its term and since when, and the others.
  function renderLeader(leader) {
    const box = $("leader");
    if (!box) return;
    if (!leader || !leader.ha) {
      box.hidden = true;
      return;
    }
    const others = (leader.candidates || []).filter((c) => c.candidate !== leader.name)
      .map((c) => `${c.candidate} (${c.state}, ${c.address})`);
    box.replaceChildren(
      el("strong", {}, "Leader: "),
      `${leader.name} serves, term ${leader.term}, since ${new Date(leader.since_unix * 1000).toISOString()}`,
      others.length ? "; other candidates: " + others.join(", ") : "; no other candidate");
    box.hidden = false;
  }

  function renderAgents() {
    const box = $("agents");
    if (!box) return;
    const tasksOf = new Map();
    for (const j of jobs) {
      if (["succeeded", "failed", "cancelled"].includes(j.state)) continue;
      for (const t of j.tasks || []) {
        if (t.state === "exited") continue;
        if (!tasksOf.has(t.agent)) tasksOf.set(t.agent, []);
        tasksOf.get(t.agent).push(el("span", { class: "task" + (t.straggler ? " straggler" : "") },
          `${j.job}/${t.task}`, t.straggler ? " (straggler)" : ""));
      }
    }
    const rows = agents.map((a) => el("tr", { class: "agent-row", dataset: { agent: a.agent } },
      el("td", {}, a.agent),
      el("td", {}, a.address),
      el("td", {}, el("span", { class: "state " + a.state }, a.state)),
      el("td", { class: "num" }, `${a.free_cores} / ${a.cores}`),
      el("td", { class: "num" }, a.memory_mb ? (a.memory_mb / 1024).toFixed(1) + " GiB" : "–"),
      el("td", {}, (a.gpus || []).length
        ? `${a.gpus_free} / ${a.gpus.length}: ` + a.gpus.map((g) => `${g.index} ${g.name}`).join(", ")
        : "–"),
      el("td", {}, a.hardware_class || "–"),
      el("td", { class: "num" }, fmtNum(a.seconds_since_heartbeat) + " s"),
      el("td", {}, ...(tasksOf.get(a.agent) || ["–"]))));
    box.replaceChildren(table("agents-table",
      ["agent", "address", "state", "free / cores", "memory", "GPUs (free / all)", "hardware", "heartbeat", "tasks"], rows));
  }

  function renderJobs() {
    const box = $("jobs");
    if (!box) return;
    const rows = jobs.slice().reverse().map((j) => {
      const p = typeof j.progress === "number" ? j.progress : (j.state === "succeeded" ? 1 : null);
      const stragglers = (j.tasks || []).filter((t) => t.straggler).map((t) => t.task);
      return el("tr", {
        class: "job-row" + (j.job === selected ? " selected" : ""), dataset: { job: j.job },
        onclick: () => selectJob(j.job),
      },
        el("td", {}, j.job),
        el("td", {}, j.name),
        el("td", {}, el("span", { class: "state " + j.state }, j.state),
          stragglers.length ? el("span", { class: "badge straggler" }, "straggler: " + stragglers.join(", ")) : null),
        el("td", {}, `${j.model} / ${j.dataset}`),
        el("td", { class: "num" }, `${j.workers} × ${j.batch_size}`),
        el("td", { class: "num" }, `${j.epochs} / ${j.epochs_total}`),
        el("td", {}, p === null ? "–" : el("progress", { max: "1", value: String(p) }),
          p === null ? null : " " + Math.round(p * 100) + " %"),
        el("td", { class: "num" }, j.state === "running" ? fmtSeconds(j.eta_seconds) : "–"),
        el("td", { class: "num" }, fmtAccuracy(j.test_accuracy)));
    });
    box.replaceChildren(table("jobs-table",
      ["job", "name", "state", "model / data set", "workers × batch", "epochs", "progress", "ETA", "test accuracy"],
      rows));
  }

  // ------------------------------------------------------------ the shared plan
  // The plan now (one row per planned elastic job), each job's workers over the plan's
  // latest changes (a stepped line per job, x in seconds before now), and the changes.
  function renderClusterPlan(cp) {
    const section = $("plan-section");
    if (!section) return;
    if (!cp || !cp.shared_plan) { section.hidden = true; return; }
    section.hidden = false;
    const span = (s) => (typeof s === "number" ? fmtSeconds(Math.max(0, s)) : "–");
    const rows = (cp.jobs || []).map((j) => el("tr", { class: "plan-row", dataset: { job: j.job } },
      el("td", {}, j.job), el("td", {}, j.owner), el("td", {}, el("span", { class: "state " + j.state }, j.state)),
      el("td", { class: "num" }, `${j.workers} → ${j.planned_workers}`),
      el("td", { class: "num" }, `[${j.min_workers}, ${j.max_workers}]` +
        (j.slots_per_worker > 1 || j.resource !== "cores" ? ` of ${j.slots_per_worker} ${j.resource} each` : "")),
      el("td", { class: "num" }, span(j.predicted_seconds)),
      el("td", { class: "num" }, "deadline_left_seconds" in j
        ? span(j.deadline_left_seconds) + (j.misses_deadline ? " (missed)" : "") : "–"),
      el("td", {}, j.reason)));
    $("cluster-plan").replaceChildren(el("p", {}, `${(cp.jobs || []).length} elastic jobs planned on ${cp.slots} cores` +
      (cp.gpu_slots ? ` and ${cp.gpu_slots} GPUs` : "")),
      table("cluster-plan-table", ["job", "owner", "state", "workers → planned", "bounds", "time left", "deadline in",
        "reason"], rows));
    const changes = cp.changes || [];
    const now = Date.now() / 1000;
    const byJob = new Map();
    for (const c of changes) {
      if (!byJob.has(c.job)) byJob.set(c.job, [[], []]);
      byJob.get(c.job)[0].push(c.t - now);
      byJob.get(c.job)[1].push(c.to);
    }
    for (const j of cp.jobs || []) {
      if (!byJob.has(j.job)) byJob.set(j.job, [[], []]);
      byJob.get(j.job)[0].push(0);
      byJob.get(j.job)[1].push(j.workers);
    }
    const names = [...byJob.keys()];
    draw("chart-shares", names, names.map((n) => byJob.get(n)), "workers", true, undefined,
      { xLabel: "seconds (0 = now)", stepped: true });
    $("plan-changes").replaceChildren(...changes.slice(-20).reverse().map((c) => el("li", { dataset: { job: c.job } },
      `${fmtSeconds(now - c.t)} ago: ${c.job} (${c.owner}) ${c.from} → ${c.to} workers: ${c.reason}`)));
  }

  // ------------------------------------------------------------ one job
  async function selectJob(id) {
    if (selected !== id) destroyCharts();
    selected = id;
    renderJobs();
    if (!followed.has(id)) {
      followed.add(id);
      try { await request("follow", { job: id }); } catch (e) { followed.delete(id); }
    }
    refreshJob();
  }

  function scheduleRefresh() {
    if (refreshTimer) { refreshDue = true; return; }
    const wait = Math.max(0, REFRESH_MS - (Date.now() - lastRefresh));
    refreshTimer = setTimeout(() => { refreshTimer = null; refreshJob(); }, wait);
  }

  async function refreshJob() {
    const id = selected;
    if (!id) return;
    lastRefresh = Date.now();
    refreshDue = false;
    let st, series, evs;
    try {
      [st, series, evs] = await Promise.all([
        request("status", { job: id }), request("series", { job: id }), request("events", { job: id, limit: 100 })]);
    } catch (e) {
      return;
    }
    if (id !== selected) return;
    renderJob(st, series, evs);
    if (refreshDue) scheduleRefresh();
  }

  function renderJob(st, series, evs) {
    const box = $("job");
    if (!box) return;
    let head = $("job-head");
    if (!head) {
      box.replaceChildren(
        el("h2", { id: "job-title" }),
        el("div", { id: "job-head", class: "cards" }),
        el("div", { id: "job-tasks" }),
        el("div", { class: "charts" },
          chartBox("chart-loss", "Training loss (per worker)"),
          chartBox("chart-accuracy", "Test accuracy (worker 0, per epoch)"),
          chartBox("chart-ips", "Images/s (per worker)"),
          chartBox("chart-bytes", "Bytes on the wire, pushed + pulled (per worker, MiB)")),
        el("div", { id: "job-plan" }),
        el("h3", {}, "Event log"), el("div", { id: "job-events" }));
      head = $("job-head");
    }
    $("job-title").textContent = `${st.job}: ${st.name}`;
    const card = (label, value, attrs = {}) => el("div", { class: "card" }, el("div", { class: "label" }, label),
      el("div", Object.assign({ class: "value" }, attrs), value));
    const accAttrs = { id: "job-accuracy" };
    if (typeof st.test_accuracy === "number") accAttrs["data-value"] = JSON.stringify(st.test_accuracy);
    head.replaceChildren(
      card("state", st.state, { id: "job-state" }),
      card("owner", st.owner || "admin", { id: "job-owner" }),
      card("test accuracy", fmtAccuracy(st.test_accuracy), accAttrs),
      card("epochs", `${st.epochs} / ${st.epochs_total}`),
      card("progress", typeof st.progress === "number" ? Math.round(st.progress * 100) + " %" :
        st.state === "succeeded" ? "100 %" : "–"),
      card("ETA", st.state === "running" ? fmtSeconds(st.eta_seconds) : "–"),
      card("wall time", fmtSeconds(st.wall_seconds)),
      card("images/s", fmtNum(st.state === "running" ? latestImagesPerSec(series) : st.images_per_sec)),
      card("pushed / pulled", `${fmtBytes(st.bytes_pushed)} / ${fmtBytes(st.bytes_pulled)}`),
      card("compression", st.compression + (typeof st.compression_ratio === "number" ?
        ` (${st.compression_ratio.toFixed(1)}×)` : "")));
    if (st.error) head.append(el("div", { class: "card wide error" }, el("div", { class: "label" }, "error"), st.error));
    // A finished job's trained model, kept by the leader, and the command that downloads it.
    for (const m of st.models || []) {
      head.append(el("div", { class: "card wide model", dataset: { checkpoint: m.checkpoint } },
        el("div", { class: "label" }, `trained model (${m.checkpoint}, ${m.model}, ${fmtBytes(m.bytes)})`),
        el("code", {}, `dltrain model get ${st.job}` + (m.checkpoint === "last" ? "" : ` --checkpoint ${m.checkpoint}`) +
          " -o DIR")));
    }
    if (st.model_error) {
      head.append(el("div", { class: "card wide" }, el("div", { class: "label" }, "no trained model kept"), st.model_error));
    }

    $("job-tasks").replaceChildren(table("tasks-table", ["task", "agent", "state", "endpoint", "restarts", "notes"],
      (st.tasks || []).map((t) => el("tr", { class: "task-row" + (t.straggler ? " straggler-row" : ""),
        dataset: { task: t.task } },
        el("td", {}, t.task), el("td", {}, t.agent), el("td", {}, el("span", { class: "state " + t.state }, t.state)),
        el("td", {}, t.endpoint || "–"), el("td", { class: "num" }, t.restarts || 0),
        el("td", {}, t.straggler ? el("span", { class: "badge straggler" }, "straggler") : null,
          [t.exit, t.error, t.recovery].filter(Boolean).join("; "))))));

    drawCharts(series);
    renderPlan(st.plan);
    renderEvents(evs);
  }

  // While a job runs: the sum of each worker's latest progress report (the job's figure,
  // from its workers' epoch ends, is 0 until the first epoch ended).
  function latestImagesPerSec(series) {
    let sum = 0;
    for (const w of series.workers || []) {
      if (w.images_per_sec.length) sum += w.images_per_sec[w.images_per_sec.length - 1];
    }
    return sum;
  }

  function chartBox(id, title) {
    return el("figure", { class: "chart" }, el("figcaption", {}, title), el("div", { id, dataset: { points: "0" } }));
  }

  function destroyCharts() {
    for (const c of Object.values(charts)) c.plot.destroy();
    charts = {};
  }

  // uPlot wants one x array shared by every series: uPlot.join aligns the workers'
  // reports (taken at different times) and leaves nulls where a worker had none.
  function drawCharts(series) {
    const workers = series.workers || [];
    const per = (f) => workers.map((w) => [w.t, w.t.map((_, i) => f(w, i))]);
    draw("chart-loss", workers.map((w) => w.task), per((w, i) => w.loss[i]), "loss");
    draw("chart-ips", workers.map((w) => w.task), per((w, i) => w.images_per_sec[i]), "images/s");
    draw("chart-bytes", workers.map((w) => w.task),
      per((w, i) => (w.bytes_pushed[i] + w.bytes_pulled[i]) / (1024 * 1024)), "MiB");
    const e = series.epochs || { t: [], test_accuracy: [] };
    const keep = e.t.map((_, i) => i).filter((i) => typeof e.test_accuracy[i] === "number");
    draw("chart-accuracy", ["worker-0"], [[keep.map((i) => e.t[i]), keep.map((i) => e.test_accuracy[i] * 100)]],
      "%", true, (u, min, max) => [Math.max(0, Math.floor(min - 5)), Math.min(100, Math.ceil(max + 5))]);
  }

  // `yRange`: uPlot's range function for the y scale (default: uPlot's own). `more`:
  // {xLabel (default "seconds since submission"), stepped (a step line: a value holds
  // until the next)}.
  function draw(id, names, tables, unit, points, yRange, more = {}) {
    const box = $(id);
    if (!box || typeof uPlot === "undefined") return;
    let n = 0;
    for (const [xs] of tables) n += xs.length;
    box.dataset.points = String(n);
    const data = tables.length ? uPlot.join(tables) : [[]];
    const key = names.join(",");
    const width = Math.max(300, box.clientWidth || 480);
    const c = charts[id];
    if (c && c.key === key) {
      c.plot.setData(data);
      return;
    }
    if (c) c.plot.destroy();
    const opts = {
      width, height: 220,
      scales: yRange ? { x: { time: false }, y: { range: yRange } } : { x: { time: false } },
      axes: [{ label: more.xLabel || "seconds since submission" }, { label: unit }],
      series: [{ label: "t (s)" }, ...names.map((nm, i) => ({
        label: nm, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: true,
        points: { show: points ? true : undefined, size: 6 },
        ...(more.stepped && uPlot.paths && uPlot.paths.stepped ? { paths: uPlot.paths.stepped({ align: 1 }) } : {}),
      }))],
      legend: { live: false },
    };
    box.replaceChildren();
    charts[id] = { plot: new uPlot(opts, data, box), key };
  }

  function renderPlan(plan) {
    const box = $("job-plan");
    if (!plan) { box.replaceChildren(); return; }
    // With method = "auto" the plan chooses the compression too: one more column, and the
    // chosen row is the one with the chosen method.
    const methods = !!plan.chooses_method;
    const chosen = (r) => plan.choice && r.workers === plan.choice.workers && r.batch_size === plan.choice.batch_size &&
      (!methods || r.compression === plan.choice.compression);
    const rows = (plan.table || []).map((r, i) => el("tr", {
      class: (chosen(r) ? "chosen " : "") + (r.feasible ? "feasible" : "rejected") },
      el("td", { class: "num" }, i + 1), el("td", { class: "num" }, r.workers), el("td", { class: "num" }, r.batch_size),
      el("td", { class: "num" }, fmtSeconds(r.total_seconds)), el("td", { class: "num" }, fmtAccuracy(r.accuracy)),
      el("td", { class: "num" }, fmtNum(r.cost, 2)), el("td", {}, r.feasible ? "yes" : "no"), el("td", {}, r.reason),
      ...(methods ? [el("td", {}, r.compression || "")] : [])));
    const link = methods ? (plan.link_bytes_per_sec > 0 ? ` Link: ${fmtNum(plan.link_bytes_per_sec * 8 / 1e6, 0)} Mbit/s.`
      : " Link: not measured.") : "";
    box.replaceChildren(el("h3", {}, "Planner's decision"),
      el("p", { id: "plan-explanation" }, (plan.explanation ||
        (plan.choice ? `${plan.choice.workers} workers × batch ${plan.choice.batch_size}` : "no feasible configuration")) + link),
      table("plan-table", ["rank", "workers", "batch", "predicted time", "predicted accuracy", "cost", "feasible",
        "reason", ...(methods ? ["compression"] : [])], rows));
  }

  function renderEvents(evs) {
    const box = $("job-events");
    const list = (evs && evs.events) || [];
    if (!list.length) {
      box.replaceChildren(el("p", { class: "muted" }, evs && evs.persistent === false ?
        "The leader keeps no event log (it has no state_dir)." : "No events yet."));
      return;
    }
    const describe = (e) => {
      const rest = Object.entries(e).filter(([k]) => !["event", "time", "job"].includes(k))
        .map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`);
      return rest.join(" ");
    };
    box.replaceChildren(table("events-table", ["time", "event", "details"], list.slice().reverse().map((e) =>
      el("tr", {}, el("td", {}, e.time ? new Date(e.time * 1000).toLocaleTimeString() : "–"),
        el("td", {}, e.event || "–"), el("td", { class: "details" }, describe(e))))));
  }

  // ------------------------------------------------------------ start
  document.addEventListener("DOMContentLoaded", () => {
    $("login").addEventListener("submit", (e) => {
      e.preventDefault();
      const t = $("token").value.trim();
      if (t) signIn(t, false);
    });
    $("logout").addEventListener("click", signOut);
    const t = sessionStorage.getItem(TOKEN_KEY);
    if (t) signIn(t, true);
    // Start-up has run (what a page-driving test waits for instead of a guessed delay).
    document.body.dataset.started = "true";
  });
})();
