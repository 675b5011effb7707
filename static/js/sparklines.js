// Throughput (prefill / decode tok/s) and queue (running / waiting) sparklines over recent snapshots (Plotly).
// Without a time range they keep the last KEEP snapshots; with one (`rangeS`, the dashboard's ?range=) they keep
// the snapshots of the last rangeS seconds, at most one per rangeS / KEEP seconds, and the x axis spans the range.

const KEEP = 240;
const LAYOUT = {
  margin: { l: 36, r: 8, t: 4, b: 20 }, height: 110, showlegend: true,
  legend: { orientation: "h", x: 0, y: 1.25, font: { size: 11 } },
  xaxis: { type: "date", showgrid: false, tickformat: "%H:%M:%S", tickfont: { size: 10 } }, yaxis: { rangemode: "tozero", tickfont: { size: 10 } },
};
const CONFIG = { displayModeBar: false, responsive: true };

export class Sparklines {
  constructor(throughputElement, queueElement, history, rangeS = null) {
    this.throughputElement = throughputElement;
    this.queueElement = queueElement;
    this.rangeS = rangeS;
    this.points = [];
    for (const point of history) this.push(point);
  }

  push(snapshot) {
    const last = this.points[this.points.length - 1];
    if (this.rangeS && last && Math.floor(last.ts * KEEP / this.rangeS) === Math.floor(snapshot.ts * KEEP / this.rangeS)) {
      this.points[this.points.length - 1] = snapshot; // the same slot of the range: the newest stands for it
    } else {
      this.points.push(snapshot);
    }
    if (this.rangeS) {
      const since = snapshot.ts - this.rangeS;
      const stale = this.points.findIndex((point) => point.ts >= since);
      this.points.splice(0, stale === -1 ? this.points.length : stale);
    } else if (this.points.length > KEEP) {
      this.points.splice(0, this.points.length - KEEP);
    }
  }

  series(field, name) {
    return {
      x: this.points.map((point) => new Date(point.ts * 1000)),
      y: this.points.map((point) => (point.engine || {})[field] ?? null),
      name, mode: "lines", line: { width: 1.5, shape: "hv" },
    };
  }

  layout() {
    const newest = this.points[this.points.length - 1];
    if (!this.rangeS || !newest) return LAYOUT;
    const end = newest.ts * 1000;
    return { ...LAYOUT, xaxis: { ...LAYOUT.xaxis, range: [new Date(end - this.rangeS * 1000), new Date(end)],
      tickformat: this.rangeS > 3600 ? "%H:%M" : "%H:%M:%S" } };
  }

  draw() {
    if (!window.Plotly) return;
    const layout = this.layout();
    Plotly.react(this.throughputElement,
      [this.series("prefill_tok_s", "prefill"), this.series("decode_tok_s", "decode")], layout, CONFIG);
    Plotly.react(this.queueElement,
      [this.series("running", "running"), this.series("waiting", "waiting")], layout, CONFIG);
  }
}
