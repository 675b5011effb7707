// Throughput (prefill / decode tok/s) and queue (running / waiting) sparklines over recent snapshots (Plotly).

const KEEP = 240;
const LAYOUT = {
  margin: { l: 36, r: 8, t: 4, b: 20 }, height: 110, showlegend: true,
  legend: { orientation: "h", x: 0, y: 1.25, font: { size: 11 } },
  xaxis: { type: "date", showgrid: false, tickformat: "%H:%M:%S", tickfont: { size: 10 } }, yaxis: { rangemode: "tozero", tickfont: { size: 10 } },
};
const CONFIG = { displayModeBar: false, responsive: true };

export class Sparklines {
  constructor(throughputElement, queueElement, history) {
    this.throughputElement = throughputElement;
    this.queueElement = queueElement;
    this.points = history.slice(-KEEP);
  }

  push(snapshot) {
    this.points.push(snapshot);
    if (this.points.length > KEEP) this.points.splice(0, this.points.length - KEEP);
  }

  series(field, name) {
    return {
      x: this.points.map((point) => new Date(point.ts * 1000)),
      y: this.points.map((point) => (point.engine || {})[field] ?? null),
      name, mode: "lines", line: { width: 1.5, shape: "hv" },
    };
  }

  draw() {
    if (!window.Plotly) return;
    Plotly.react(this.throughputElement,
      [this.series("prefill_tok_s", "prefill"), this.series("decode_tok_s", "decode")], LAYOUT, CONFIG);
    Plotly.react(this.queueElement,
      [this.series("running", "running"), this.series("waiting", "waiting")], LAYOUT, CONFIG);
  }
}
