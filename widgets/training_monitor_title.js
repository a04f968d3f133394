// TrainingMonitor's header line: the job, its status and replicas (the `value` trait, HTML).
// A kernel restart leaves every widget on the page drawn as last synced: ipywidgets only marks
// their models disconnected (comm_live false, class jupyter-widgets-disconnected). A job shown
// "running" then stayed "running" for a job no kernel follows any more. When this model's link
// to its kernel goes, the header shows the `gone` trait instead: the job is no longer followed.

const DISCONNECTED = "jupyter-widgets-disconnected";

function render({ model, el }) {
  const line = document.createElement("div");
  line.className = "cg-monitor-title";
  el.appendChild(line);
  let lost = el.closest(`.${DISCONNECTED}`) !== null; // drawn again after the kernel went
  const draw = () => {
    line.innerHTML = lost ? model.get("gone") : model.get("value");
    line.dataset.kernel = lost ? "gone" : "live";
  };
  model.on("change:value", draw);
  // comm_live only goes from true to false (a restart disconnects every model of the old kernel).
  model.on("comm_live_update", () => {
    lost = true;
    draw();
  });
  draw();
}

export default { render };
