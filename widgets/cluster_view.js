// ClusterView: the cluster's workers as a table, its dashboard link, and a Refresh button.
// Everything shown comes from the model's traits (cluster_view.py), so a static render
// (exported HTML with widget state) shows the last state read.

const ROLE_COLOURS = { ps: "#f28e2b", worker: "#4e79a7", idle: "#9c9c9c" };

function formatBytes(count) {
  if (count === null || count === undefined || count < 0) return "?";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let unit = 0;
  while (count >= 1024 && unit < units.length - 1) {
    count /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${count} B` : `${count.toFixed(1)} ${units[unit]}`;
}

function cell(row, text, style = "") {
  const td = document.createElement("td");
  td.textContent = text;
  td.style.cssText = `padding:2px 8px;${style}`;
  row.appendChild(td);
  return td;
}

function roleBadge(worker) {
  const badge = document.createElement("span");
  badge.textContent = worker.task === null ? worker.role : `${worker.role}/${worker.task}`;
  badge.className = `cellgraph-role cellgraph-role-${worker.role}`;
  const colour = ROLE_COLOURS[worker.role] || ROLE_COLOURS.idle;
  badge.style.cssText = `background:${colour};color:white;border-radius:3px;padding:0 6px;font-family:monospace`;
  return badge;
}

function header(model) {
  const head = document.createElement("div");
  head.style.cssText = "display:flex;gap:12px;align-items:center;margin-bottom:4px";
  const title = document.createElement("b");
  title.textContent = `Cluster ${model.get("scheduler")} (${model.get("kind")})${model.get("closed") ? ", closed" : ""}`;
  head.appendChild(title);
  const link = model.get("dashboard_link");
  if (link) {
    const a = document.createElement("a");
    a.href = link;
    a.target = "_blank";
    a.rel = "noopener";
    a.textContent = "Dask dashboard";
    a.className = "cellgraph-dashboard-link";
    head.appendChild(a);
  }
  const refresh = document.createElement("button");
  refresh.textContent = "Refresh";
  refresh.className = "cellgraph-refresh";
  refresh.addEventListener("click", () => model.send({ type: "refresh" }));
  head.appendChild(refresh);
  return head;
}

function table(workers) {
  const t = document.createElement("table");
  t.className = "cellgraph-workers";
  t.style.borderCollapse = "collapse";
  const head = t.createTHead().insertRow();
  for (const name of ["role", "name", "address", "host", "threads", "memory (used / limit)", "devices"]) {
    const th = document.createElement("th");
    th.textContent = name;
    th.style.cssText = "text-align:left;padding:2px 8px;border-bottom:1px solid #ccc";
    head.appendChild(th);
  }
  const body = t.createTBody();
  for (const worker of workers) {
    const row = body.insertRow();
    row.dataset.address = worker.address;
    cell(row, "").appendChild(roleBadge(worker));
    cell(row, worker.name);
    cell(row, worker.address, "font-family:monospace");
    cell(row, worker.host);
    cell(row, String(worker.nthreads));
    // Dask's memory_limit 0 means the worker has none.
    const limit = worker.memory_limit > 0 ? formatBytes(worker.memory_limit) : "no limit";
    cell(row, `${formatBytes(worker.memory)} / ${limit}`);
    cell(row, worker.devices.map((d) => d.split("/device:").pop()).join(", ") || "-", "font-family:monospace");
  }
  return t;
}

// What the view says once its kernel is gone (restarted or shut down): the page keeps the widgets drawn as
// last synced, and a list of workers would read as a cluster still up.
function goneWords(model) {
  const after = model.get("kind").startsWith("local")
    ? "a local cluster closes with the kernel that started it: %cluster up starts another"
    : `the cluster at ${model.get("scheduler")} keeps running: %cluster connect ${model.get("scheduler")} joins it again`;
  return `the notebook's kernel restarted or stopped, so this view no longer follows the cluster (as last seen below); ${after}`;
}

function draw(model, el, gone) {
  el.replaceChildren();
  const root = document.createElement("div");
  root.className = "cellgraph-cluster-view";
  root.dataset.kernel = gone ? "gone" : "live";
  root.appendChild(header(model));
  if (gone) {
    root.querySelector(".cellgraph-refresh").disabled = true;
    const p = document.createElement("div");
    p.className = "cellgraph-kernel-gone";
    p.style.color = "#e15759";
    p.textContent = goneWords(model);
    root.appendChild(p);
  }
  const error = model.get("error");
  if (error) {
    const p = document.createElement("div");
    p.className = "cellgraph-error";
    p.style.color = "#e15759";
    p.textContent = error;
    root.appendChild(p);
  }
  const note = model.get("note");
  if (note) {
    const p = document.createElement("div");
    p.className = "cellgraph-note";
    p.textContent = note;
    root.appendChild(p);
  }
  const workers = model.get("workers");
  if (workers.length) root.appendChild(table(workers));
  el.appendChild(root);
}

function render({ model, el }) {
  // A restart disconnects every model of the old kernel (comm_live goes false, once): see goneWords.
  let gone = el.closest(".jupyter-widgets-disconnected") !== null;
  const redraw = () => draw(model, el, gone);
  const lost = () => {
    gone = true;
    redraw();
  };
  const names = ["scheduler", "kind", "dashboard_link", "workers", "devices", "closed", "error", "note"];
  for (const name of names) model.on(`change:${name}`, redraw);
  model.on("comm_live_update", lost);
  redraw();
  return () => {
    for (const name of names) model.off(`change:${name}`, redraw);
    model.off("comm_live_update", lost);
  };
}

export default { render };
