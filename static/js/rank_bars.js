// One stacked VRAM bar per rank (weights, KV pool, state pool, arena, workspace, other, free) with the
// corridor and arming floors drawn where used memory must stop, and the armable / binding badges.

import { bytes, tokens } from "./format.js";

const SEGMENTS = [
  ["weights", "weights"], ["kv_pool", "KV pool"], ["state_pool", "state pool"], ["arena", "arena"],
  ["workspace", "workspace"], ["other", "other"],
];

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function segment(kind, label, size, scale) {
  const node = element("span", `seg seg-${kind}`);
  node.style.width = `${(100 * size) / scale}%`;
  node.title = `${label}: ${bytes(size)}`;
  return node;
}

function floorMark(kind, label, floor, total, scale) {
  const node = element("span", `mark mark-${kind}`);
  node.style.left = `${(100 * Math.max(total - floor, 0)) / scale}%`;
  node.title = `${label}: keep ${bytes(floor)} free`;
  return node;
}

function renderRank(container, rank, bindingRank) {
  const used = rank.used || {};
  const usedTotal = SEGMENTS.reduce((sum, [kind]) => sum + (used[kind] || 0), 0);
  const scale = Math.max(rank.total_bytes, usedTotal + rank.free_bytes, 1);
  const kv = rank.kv || {};

  const label = element("div", "rank-label");
  label.append(element("strong", "", `rank ${rank.rank}`), ` ${rank.name} (${rank.device}) · `,
    `${bytes(usedTotal)} used of ${bytes(rank.total_bytes)}, ${bytes(rank.free_bytes)} free · `,
    `KV ${tokens(kv.tokens_used)} / ${tokens(kv.tokens_total)} tokens `);
  const armable = element("span", rank.armable ? "badge ok" : "badge bad", rank.armable ? "armable" : "not armable");
  armable.dataset.testid = "armable";
  label.append(armable);
  if (rank.rank === bindingRank) label.append(" ", element("span", "badge binds", "binds the pool"));

  const bar = element("div", "bar");
  for (const [kind, name] of SEGMENTS) bar.append(segment(kind, name, used[kind] || 0, scale));
  bar.append(segment("free", "free", rank.free_bytes, scale));
  bar.append(floorMark("corridor", "corridor floor", rank.corridor_floor_bytes, rank.total_bytes, scale));
  bar.append(floorMark("arming", "arming floor", rank.arming_floor_bytes, rank.total_bytes, scale));
  container.replaceChildren(label, bar);
}

// Keeps one [data-testid=rank-bar] per rank in `host`, in rank order.
export function renderRankBars(host, snapshot) {
  const binding = (snapshot.engine || {}).binding_rank;
  const wanted = snapshot.ranks.map((rank) => String(rank.rank));
  for (const stale of host.querySelectorAll("[data-testid=rank-bar]")) {
    if (!wanted.includes(stale.dataset.rank)) stale.remove();
  }
  for (const rank of snapshot.ranks) {
    let container = host.querySelector(`[data-testid=rank-bar][data-rank="${rank.rank}"]`);
    if (!container) {
      container = element("div", "rank-bar");
      container.dataset.testid = "rank-bar";
      container.dataset.rank = rank.rank;
    }
    host.append(container); // (re)appending keeps them in rank order
    renderRank(container, rank, binding);
  }
}
