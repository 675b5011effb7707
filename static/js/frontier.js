// The frontier chart: pipelined speedup against pool tokens, the incumbent marked, the noise-floor band shaded,
// each point's speedup interval from the fitted timing drawn as an error bar (and a measured cut's measured pool as
// a horizontal one); hovering shows a point's figures and clicking one opens a proposal for its cut.

import { cut, msList, speedup } from "./format.js";

const data = JSON.parse(document.getElementById("frontier-data").textContent);
const { frontier, propose_url: proposeUrl } = data;
const noiseFloor = frontier.noise_floor;
const floorSource = frontier.noise_floor_source === "measured" ? "measured" : "rig's";

const hover = [
  "cut %{customdata[7]}", "attention split %{customdata[1]}", "pool %{x:,} tokens (binds: rank %{customdata[2]})",
  "× pipelined %{y:.2f}x (interval %{customdata[5]}), × serial %{customdata[3]}", "provenance: %{customdata[4]}",
  "measured: %{customdata[6]}", "<extra></extra>",
].join("<br>");

function interval(point) {
  const bounds = point.x_pipelined_interval;
  if (!bounds) return "none: nothing measured";
  return `${speedup(bounds[0])}–${speedup(bounds[1])}`;
}

function measured(point) {
  const seen = point.measured;
  if (!seen) return "not measured";
  const stages = seen.stage_ms ? `stage times ${msList(seen.stage_ms)} (${seen.samples} samples)` : "no decode steps";
  return `${stages}, pool ${seen.pool_tokens ?? "not at this shape"}`;
}

// Plotly's error bars are distances from the point: up to the interval's high end and down to its low end.
function errorY(points) {
  const bounds = points.map((point) => point.x_pipelined_interval);
  return {
    type: "data", symmetric: false, visible: bounds.some((b) => b !== null), color: "#7a8699", thickness: 1.2,
    array: bounds.map((b, i) => (b ? b[1] - points[i].x_pipelined : 0)),
    arrayminus: bounds.map((b, i) => (b ? points[i].x_pipelined - b[0] : 0)),
  };
}

// A measured cut's allocated pool against the priced one, when they differ.
function errorX(points) {
  const gaps = points.map((point) => (point.measured && point.measured.pool_tokens !== null
    ? point.measured.pool_tokens - point.pool_tokens : 0));
  return {
    type: "data", symmetric: false, visible: gaps.some((gap) => gap !== 0), color: "#27ae60", thickness: 1.2,
    array: gaps.map((gap) => Math.max(gap, 0)), arrayminus: gaps.map((gap) => Math.max(-gap, 0)),
  };
}

function trace(points, name, marker, mode) {
  return {
    type: "scatter", mode, name, marker, hovertemplate: hover, error_y: errorY(points), error_x: errorX(points),
    x: points.map((point) => point.pool_tokens),
    y: points.map((point) => point.x_pipelined),
    customdata: points.map((point) => [point.cut.join(","), cut(point.attention_split),
      point.binding_rank ?? "none", speedup(point.x_serial), point.provenance, interval(point), measured(point), cut(point.cut)]),
  };
}

const byPool = [...frontier.points].sort((a, b) => a.pool_tokens - b.pool_tokens);
const traces = [trace(byPool, "frontier", { size: 11, color: "#2f80ed" }, "lines+markers")];
if (frontier.incumbent.pool_tokens !== null) {
  traces.push(trace([frontier.incumbent], "incumbent", { size: 16, symbol: "star", color: "#f2994a" }, "markers"));
}

const layout = {
  margin: { l: 60, r: 20, t: 20, b: 50 }, hovermode: "closest", legend: { orientation: "h", y: 1.08 },
  xaxis: { title: { text: "KV pool (tokens)" }, rangemode: "tozero" },
  yaxis: { title: { text: "pipelined speedup (× incumbent)" } },
  shapes: [{
    type: "rect", xref: "paper", x0: 0, x1: 1, yref: "y", y0: 1 - noiseFloor, y1: 1 + noiseFloor,
    fillcolor: "rgba(160, 167, 180, 0.25)", line: { width: 0 }, layer: "below",
  }],
  annotations: [{
    xref: "paper", x: 1, xanchor: "right", yref: "y", y: 1 + noiseFloor, yanchor: "bottom", showarrow: false,
    text: `noise floor ±${Math.round(noiseFloor * 1000) / 10}% (${floorSource})`, font: { size: 11, color: "#5d6778" },
  }],
};

const chart = document.getElementById("frontier-chart");
Plotly.newPlot(chart, traces, layout, { displaylogo: false, responsive: true }).then(() => {
  chart.on("plotly_click", (event) => {
    const point = event.points && event.points[0];
    if (point) window.location.assign(`${proposeUrl}?kind=cut&cut=${point.customdata[0]}`);
  });
});
