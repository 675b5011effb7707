// The job page, live while the job is active: subscribe to "job-<id>", re-read the job from the API after every
// (re)subscribe (so nothing between load and subscribe is missed), and redraw status, phase and progress.
// A changed plan, or the job's end, reloads the page: the reviewer sees the new plan, the operator the outcome.

import { connectLive } from "./live.js";

const main = document.querySelector("main[data-job-id]");
const jobId = main.dataset.jobId;
const terminal = JSON.parse(document.getElementById("job-terminal").textContent);

function apply(job) {
  if (String(job.id) !== jobId) return;
  if (job.plan_hash !== main.dataset.planHash || (terminal.includes(job.status) && job.status !== main.dataset.status)) {
    window.location.reload();
    return;
  }
  main.dataset.status = job.status;
  document.getElementById("job-status").textContent = job.status;
  document.getElementById("job-phase").textContent = job.phase || "—";
  document.getElementById("job-progress").value = Math.min(Math.max(Number(job.progress) || 0, 0), 1);
  const error = document.getElementById("job-error");
  error.textContent = job.error || "";
  error.hidden = !job.error;
  for (const form of document.querySelectorAll("[data-while]")) {
    form.hidden = !form.dataset.while.split(" ").includes(job.status);
  }
}

async function reread() {
  const response = await fetch(`/api/v1/jobs/${jobId}/`, { headers: { Accept: "application/json" } });
  if (response.ok) apply(await response.json()); // the API's job has every field a live update has
}

connectLive({
  groups: [`job-${jobId}`],
  statusElement: document.getElementById("live-status"),
  onSubscribed: reread,
  onMessage(message) {
    if (message.type === "job") apply(message.job);
  },
});
