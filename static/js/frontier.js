// The frontier chart: pipelined speedup against pool tokens, the incumbent marked, the noise-floor band shaded;
// hovering shows a point's figures and clicking one opens a proposal for its cut.

const data = JSON.parse(document.getElementById("frontier-data").textContent);
const { frontier, noise_floor: noiseFloor, propose_url: proposeUrl } = data;

const hover = [
  "cut %{customdata[0]}", "attention split %{customdata[1]}", "pool %{x:,} tokens (binds: rank %{customdata[2]})",
  "× pipelined %{y:.3f}, × serial %{customdata[3]:.3f}", "provenance: %{customdata[4]}", "<extra></extra>",
].join("<br>");

function trace(points, name, marker, mode) {
  return {
    type: "scatter", mode, name, marker, hovertemplate: hover,
    x: points.map((point) => point.pool_tokens),
    y: points.map((point) => point.x_pipelined),
    customdata: points.map((point) => [point.cut.join(","), point.attention_split.join(","),
      point.binding_rank ?? "none", point.x_serial, point.provenance]),
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
    text: `noise floor ±${Math.round(noiseFloor * 1000) / 10}%`, font: { size: 11, color: "#5d6778" },
  }],
};

const chart = document.getElementById("frontier-chart");
Plotly.newPlot(chart, traces, layout, { displaylogo: false, responsive: true }).then(() => {
  chart.on("plotly_click", (event) => {
    const point = event.points && event.points[0];
    if (point) window.location.assign(`${proposeUrl}?kind=cut&cut=${point.customdata[0]}`);
  });
});
