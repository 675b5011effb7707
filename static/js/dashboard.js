// The dashboard, live: the page was rendered with the latest snapshot and its seq; after every (re)subscribe
// to "telemetry" it fetches the snapshots after the seq it holds and applies them in order, holding back live
// ones until the fetch answers, so nothing between load and subscribe (or during an outage) is missed.

import { cut as cutText, ms as msText, tokens } from "./format.js";
import { connectLive } from "./live.js";
import { renderRankBars } from "./rank_bars.js";
import { Sparklines } from "./sparklines.js";

const FETCH_RETRY_MS = 2000;
const KEEP_APPLIED = 5000;

const byId = (id) => document.getElementById(id);
const initial = JSON.parse(byId("telemetry-snapshot").textContent);
const sparklines = new Sparklines(byId("throughput-chart"), byId("queue-chart"),
  JSON.parse(byId("telemetry-history").textContent), JSON.parse(byId("telemetry-range").textContent));

// Seqs applied, in order (for tests and for a look from the console: window.seamTelemetry.applied).
const state = { seq: initial ? initial.seq : -1, ts: initial ? initial.ts : 0, applied: [] };
window.seamTelemetry = state;
let fetching = false;
let heldBack = [];

function summary(snapshot) {
  const engine = snapshot.engine || {};
  const pools = snapshot.ranks.map((rank) => rank.kv || {}).filter((kv) => kv.tokens_total);
  return {
    cutList: engine.cut || [],
    cut: (engine.cut || []).join(","),
    kvTotal: pools.length ? Math.min(...pools.map((kv) => kv.tokens_total)) : 0,
    kvUsed: pools.length ? Math.max(...pools.map((kv) => kv.tokens_used || 0)) : 0,
    bindingRank: engine.binding_rank ?? "—",
    phase: engine.phase || "—",
    shape: engine.shape || {},
    ...measured(engine, snapshot.ranks),
  };
}

const STEP_KINDS = ["decode", "prefill"];

// What the engine measured of its layout (engine.measurement: contracts/measurement.py LayoutMeasurement), as
// console/ui/telemetry.py measured() reads it: stages stay empty while the window has no steps, latency null while
// no request has finished.
function measured(engine, ranks) {
  const m = engine.measurement;
  if (!m || typeof m !== "object") {
    return { model: "", rig: "", fingerprint: engine.fingerprint || "", stages: [], steps: {}, latency: null };
  }
  const steps = Object.fromEntries(STEP_KINDS.map((kind) => [kind, (m[kind] || {}).steps || 0]));
  const stages = [];
  if (STEP_KINDS.some((kind) => steps[kind])) {
    (m.cut || []).forEach((_layers, rank) => {
      const row = { rank, name: (ranks[rank] || {}).name || "" };
      for (const kind of STEP_KINDS) {
        const stats = m[kind] || {};
        row[kind] = stats.median_ms ? { median: stats.median_ms[rank], spread: stats.spread_ms[rank] } : null;
      }
      stages.push(row);
    });
  }
  const latency = m.latency && m.latency.requests ? m.latency : null;
  return { model: m.model || "", rig: m.rig || "", fingerprint: m.fingerprint || "", stages, steps, latency };
}

const ms = (value) => (value == null ? "not measured yet" : msText(value));
const spread = (cell) => (cell ? `${cell.median.toFixed(2)} ± ${msText(cell.spread)}` : "—");

function renderMeasured(figures) {
  byId("engine-model").textContent = figures.model || "—";
  byId("engine-rig").textContent = figures.rig || "—";
  byId("engine-fingerprint").textContent = figures.fingerprint || "—";
  const latency = figures.latency;
  byId("latency-ttft").textContent = ms(latency && latency.ttft_ms);
  byId("latency-itl").textContent = ms(latency && latency.itl_ms);
  const requests = latency ? latency.requests : 0;
  byId("latency-requests").textContent = `${requests} recent request${requests === 1 ? "" : "s"}`;
  byId("stages-not-measured").hidden = figures.stages.length > 0;
  byId("stage-table").hidden = figures.stages.length === 0;
  for (const kind of STEP_KINDS) byId(`${kind}-steps`).textContent = `(${figures.steps[kind] || 0} steps)`;
  byId("stage-rows").replaceChildren(...figures.stages.map((row) => {
    const tr = document.createElement("tr");
    tr.dataset.testid = "stage-row";
    tr.dataset.rank = row.rank;
    const label = document.createElement("td");
    label.textContent = `rank ${row.rank} ${row.name}`;
    tr.append(label);
    for (const kind of STEP_KINDS) {
      const cell = document.createElement("td");
      cell.className = "num";
      cell.dataset.testid = `stage-${kind}`;
      cell.textContent = spread(row[kind]);
      tr.append(cell);
    }
    return tr;
  }));
}

function setTokens(id, value) {
  const node = byId(id);
  node.dataset.tokens = value;
  node.textContent = tokens(value);
}

function render(snapshot) {
  const figures = summary(snapshot);
  byId("no-telemetry").hidden = true;
  byId("telemetry-seq").textContent = snapshot.seq;
  byId("telemetry-time").textContent = snapshot.ts ? `at ${new Date(snapshot.ts * 1000).toLocaleTimeString()}` : "";
  const cut = byId("current-cut");
  cut.dataset.cut = figures.cut;
  cut.textContent = cutText(figures.cutList);
  const shape = figures.shape;
  byId("current-shape").textContent =
    `${shape.max_model_len} tokens × ${shape.max_num_seqs} seqs, KV ${shape.kv_dtype || "model dtype"}`;
  byId("phase").textContent = figures.phase;
  setTokens("kv-pool-used", figures.kvUsed);
  setTokens("kv-pool-total", figures.kvTotal);
  const meter = byId("kv-pool-meter");
  meter.max = Math.max(figures.kvTotal, 1);
  meter.value = figures.kvUsed;
  byId("binding-rank").textContent = figures.bindingRank;
  renderMeasured(figures);
  renderRankBars(byId("rank-bars"), snapshot);
}

function apply(snapshots) {
  let newest = null;
  for (const snapshot of [...snapshots].sort((a, b) => a.seq - b.seq)) {
    // A lower seq with a newer timestamp is a restarted engine counting again; anything else old is a repeat.
    const restarted = snapshot.seq <= state.seq && snapshot.ts > state.ts;
    if (snapshot.seq <= state.seq && !restarted) continue;
    state.seq = snapshot.seq;
    state.ts = snapshot.ts;
    state.applied.push(snapshot.seq);
    if (state.applied.length > KEEP_APPLIED) state.applied.splice(0, state.applied.length - KEEP_APPLIED);
    sparklines.push(snapshot);
    newest = snapshot;
  }
  if (newest) {
    render(newest);
    sparklines.draw();
  }
}

const live = connectLive({
  groups: ["telemetry"],
  statusElement: byId("live-status"),
  onSubscribed() {
    fetching = true;
    heldBack = [];
    live.send({ action: "fetch", after_seq: state.seq });
  },
  onMessage(message) {
    if (message.type === "telemetry") {
      if (fetching) heldBack.push(message.snapshot);
      else apply([message.snapshot]);
    } else if (message.type === "fetched") {
      fetching = false;
      apply([...message.snapshots, ...heldBack]);
      heldBack = [];
    } else if (message.type === "error" && fetching) {
      setTimeout(() => fetching && live.send({ action: "fetch", after_seq: state.seq }), FETCH_RETRY_MS);
    }
  },
});

if (initial) renderRankBars(byId("rank-bars"), initial);
sparklines.draw();
