// GraphView's browser half: draws the graph's visible part, opens and closes scopes itself, and asks the
// kernel for the rest.
//
// Pan: drag, or the wheel; zoom: Ctrl/Cmd + wheel, or pinch; "fit" shows it all.
//
// Python sends `structure` once: every item's box, its place in its container's layout with every child
// closed, and the graph's edges. Opening or closing a scope is done here (re-stacking the layouts around the
// open boxes, as graph_layout.py's scene() does), so it does not wait for a kernel that is running a cell;
// the new `expanded` goes to Python as a trait change. Selecting, searching and revealing are asked of
// Python by custom message. Everything drawn comes from synced traits, so a page exported with widget state
// renders (and opens scopes) without a kernel. Each finished drawing leaves a performance mark
// ("cellgraph-graphview-paint") that the benchmark reads.

const STYLE_ID = "cellgraph-graphview-style";
// Colours from JupyterLab's theme variables (light and dark alike), with light fallbacks elsewhere.
const CSS = `
.cgv { font: 12px/1.3 system-ui, sans-serif; color: var(--jp-ui-font-color1, #222); background: var(--jp-layout-color1, #fff);
  border: 1px solid var(--jp-border-color2, #ddd); border-radius: 4px; }
.cgv-bar { display: flex; gap: 8px; align-items: center; padding: 4px 6px; border-bottom: 1px solid var(--jp-border-color2, #eee); flex-wrap: wrap; }
.cgv-bar input { width: 220px; padding: 2px 6px; }
.cgv-legend { display: flex; gap: 10px; flex-wrap: wrap; }
.cgv-legend span { display: inline-flex; align-items: center; gap: 4px; }
.cgv-legend i { width: 10px; height: 10px; border-radius: 2px; display: inline-block; border: 1px solid #0003; }
.cgv-main { display: flex; position: relative; }
.cgv-svg { flex: 1; min-width: 0; background: var(--jp-layout-color0, #fcfcfc); cursor: grab; user-select: none; touch-action: none; }
.cgv-svg text { font: 12px monospace; pointer-events: none; }
.cgv-svg .cgv-head { fill: var(--jp-ui-font-color1, #222); }
.cgv-svg .cgv-sub { font-size: 10px; fill: var(--jp-ui-font-color1, #333); }
.cgv-svg .cgv-halo { paint-order: stroke; stroke: #fffc; stroke-width: 3px; stroke-linejoin: round; }
.cgv-svg .cgv-elabel { font-size: 10px; fill: var(--jp-ui-font-color2, #666); }
.cgv-svg [data-id] { cursor: pointer; }
.cgv-svg .cgv-edge { fill: none; stroke: #888; stroke-width: 1.2; }
.cgv-svg .cgv-ctl { stroke-dasharray: 2 3; stroke: #aaa; }
.cgv-svg .cgv-cross { stroke: #c0392b; stroke-dasharray: 6 3; stroke-width: 1.6; }
.cgv-svg .cgv-sr { font-size: 9px; fill: #c0392b; font-weight: bold; }
.cgv-svg .cgv-hit > .cgv-ol { stroke: #ff00aa; stroke-width: 3; }
.cgv-svg .cgv-sel > .cgv-ol { stroke: var(--jp-ui-font-color0, #000); stroke-width: 3; }
.cgv-panel { width: 280px; max-height: 100%; overflow: auto; border-left: 1px solid var(--jp-border-color2, #eee); padding: 6px 8px; font-size: 12px; }
.cgv-panel h4 { margin: 2px 0 6px; font-size: 13px; word-break: break-all; }
.cgv-panel table { border-collapse: collapse; width: 100%; }
.cgv-panel td { padding: 1px 4px 1px 0; vertical-align: top; word-break: break-all; }
.cgv-panel td:first-child { color: var(--jp-ui-font-color2, #666); white-space: nowrap; }
.cgv-hint { color: var(--jp-ui-font-color2, #666); }
.cgv-matches { max-height: 140px; overflow: auto; }
.cgv-matches div { cursor: pointer; padding: 1px 0; }
.cgv-matches div:hover { background: var(--jp-layout-color3, #eef); }
.cgv-error { color: var(--jp-error-color1, #b00); padding: 2px 6px; }
.cgv-error:empty { display: none; }
`;

const esc = (s) =>
  String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);

function textColor(hex) {
  // Dark fills get white text, so every label stays readable.
  const n = parseInt(hex.slice(1), 16);
  const lum = 0.299 * (n >> 16) + 0.587 * ((n >> 8) & 255) + 0.114 * (n & 255);
  return lum < 140 ? "#fff" : "#111";
}

function box(n, selected) {
  const cls = ["cgv-item", n.hit ? "cgv-hit" : "", n.name === selected ? "cgv-sel" : ""].join(" ");
  const head = `<g class="${cls}" data-id="${esc(n.id)}" data-kind="${n.kind}"${n.kind === "node" ? "" : ` data-open="${n.open ? 1 : 0}"`} transform="translate(${n.x},${n.y})">`;
  const mix = n.mix ? "\n" + n.mix.map(([, share, key, count]) => `${count} on ${key} (${Math.round(share * 100)}%)`).join("\n") : "";
  // Stale: a re-run cell removed or changed what these nodes read; running them raises until their cell runs again.
  const stale = n.stale ? (n.kind === "node" ? " · stale: re-run its cell" : ` · ${n.stale} stale node(s): re-run their cells`) : "";
  const title = `<title>${esc(n.name)}${n.sub ? " · " + esc(n.sub) : ""}${stale}${esc(mix)}</title>`;
  const rx = n.kind === "node" ? n.h / 2 : 4;
  // Drawn over the box, so the search-hit and selection outlines (CSS) stay visible.
  const outline =
    (n.stale ? `<rect class="cgv-stale" width="${n.w}" height="${n.h}" rx="${rx}" fill="none" stroke="#c0392b" stroke-width="2.5" stroke-dasharray="5 3"/>` : "") +
    `<rect class="cgv-ol" width="${n.w}" height="${n.h}" rx="${rx}" fill="none" stroke="none"/>`;
  if (n.open) {
    // An open container: a tinted frame whose header closes it again.
    return (
      `${head}<rect width="${n.w}" height="${n.h}" rx="6" fill="${n.color}22" stroke="${n.color}" stroke-width="1.5"/>` +
      `<text class="cgv-head" x="8" y="17">▾ ${esc(n.label)}</text><text class="cgv-sub" x="${n.w - 8}" y="17" text-anchor="end">${esc(n.sub)}</text>${outline}${title}</g>`
    );
  }
  // A mixed scope: bands of each colour as wide as their share, its text dark on a light halo over them.
  const mixed = n.kind !== "node" && n.mix;
  const fg = mixed ? "#111" : textColor(n.color);
  const halo = mixed ? ` class="cgv-halo"` : "";
  let shape;
  if (n.kind === "node") {
    shape =
      `<rect width="${n.w}" height="${n.h}" rx="${n.h / 2}" fill="${n.color}" stroke="#0005"/>` +
      `<text x="${n.w / 2}" y="${n.h / 2 + 4}" text-anchor="middle" fill="${fg}">${esc(n.label)}</text>`;
  } else {
    const stack = n.kind === "fold" ? `<rect x="4" y="-4" width="${n.w}" height="${n.h}" rx="4" fill="${n.color}" stroke="#0005"/>` : "";
    let bands = "";
    if (mixed) {
      let x = 0;
      for (const [c, share, key, count] of n.mix) {
        bands += `<rect class="cgv-band" data-key="${esc(key)}" data-count="${count}" x="${x}" y="0" width="${share * n.w}" height="${n.h}" fill="${c}" stroke="none"/>`;
        x += share * n.w;
      }
    }
    shape =
      stack +
      `<rect width="${n.w}" height="${n.h}" rx="4" fill="${n.color}" stroke="#0007" stroke-width="1.5"/>${bands}` +
      `<text x="8" y="16" fill="${fg}"${halo}>⊕ ${esc(n.label)}</text>` +
      `<text class="cgv-sub${mixed ? " cgv-halo" : ""}" x="8" y="31" fill="${fg}" style="fill:${fg}">${esc(n.sub)}</text>`;
  }
  return head + shape + outline + title + "</g>";
}

function edge(e, at) {
  const a = at.get(e.s);
  const b = at.get(e.t);
  if (!a || !b) return "";
  const x1 = a.x + a.w / 2;
  const y1 = a.y + a.h;
  const x2 = b.x + b.w / 2;
  const y2 = b.y;
  const dy = Math.max(30, Math.abs(y2 - y1) / 2);
  const d = `M${x1},${y1} C${x1},${y1 + dy} ${x2},${y2 - dy} ${x2},${y2}`;
  const cls = "cgv-edge" + (e.ctl ? " cgv-ctl" : "") + (e.cross ? " cgv-cross" : "");
  let out = `<path class="${cls}" d="${d}" marker-end="url(#cgv-arrow)">`;
  const tip = e.cross ? "Send/Recv: " + e.cross.map(([s, t]) => `${s} → ${t}`).join("; ") : "";
  out += `<title>${esc((e.label || "control") + (e.n > 1 ? ` (${e.n} edges)` : "") + (tip ? "\n" + tip : ""))}</title></path>`;
  if (e.label) out += `<text class="cgv-elabel" x="${(x1 + x2) / 2 + 4}" y="${(y1 + y2) / 2}">${esc(e.label)}</text>`;
  if (e.cross) {
    // A cross-device edge is a Send on the producer's device and a Recv on the consumer's.
    out += `<text class="cgv-sr" x="${x1 + 3}" y="${y1 + 11}">Send</text>`;
    out += `<text class="cgv-sr" x="${x2 + 3}" y="${y2 - 4}">Recv</text>`;
  }
  return out;
}

const EPSILON = 1e-6; // as graph_layered.py: a box that ends where another starts is before it

// The structure's columns, indexed once: children of each container (-1 is the root), names of what opens.
function indexStructure(S) {
  const n = S.id.length;
  const kids = new Map([[-1, []]]);
  const byName = new Map();
  const nodeIndex = new Map();
  for (let i = 0; i < n; i++) {
    if (!kids.has(S.parent[i])) kids.set(S.parent[i], []);
    kids.get(S.parent[i]).push(i);
    if (S.kind[i] === "node") nodeIndex.set(S.name[i], i);
    else byName.set(S.name[i], i);
  }
  return { S, n, kids, byName, nodeIndex };
}

// Each start moves by the growth of every box that ends at or before it: graph_layered.restack's rule.
function shifts(start, length, growth) {
  const ends = start.map((s, i) => [s + length[i], growth[i]]).sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  const sums = [0];
  for (const [, g] of ends) sums.push(sums[sums.length - 1] + g);
  return start.map((s) => {
    let lo = 0;
    let hi = ends.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (ends[mid][0] <= s + EPSILON) lo = mid + 1;
      else hi = mid;
    }
    return sums[lo];
  });
}

// The scene Python's GraphModel.scene() would send for `open` (item indices) and `hits` (node names).
function computeScene(T, open, hits) {
  const { S, kids } = T;
  const { pad, header } = S.metrics;
  const boxes = new Map();
  const size = (i) => {
    if (!open.has(i)) return [S.w[i], S.h[i]];
    const box = layout(i);
    return [Math.max(box.w + 2 * pad, S.ow[i]), box.h + header + pad];
  };
  function layout(c) {
    if (boxes.has(c)) return boxes.get(c);
    const ch = kids.get(c) || [];
    const sizes = ch.map(size);
    let xs = ch.map((i) => S.x[i]);
    let ys = ch.map((i) => S.y[i]);
    if (ch.some((i, k) => sizes[k][0] !== S.w[i] || sizes[k][1] !== S.h[i])) {
      const dx = shifts(xs, ch.map((i) => S.w[i]), ch.map((i, k) => sizes[k][0] - S.w[i]));
      const dy = shifts(ys, ch.map((i) => S.h[i]), ch.map((i, k) => sizes[k][1] - S.h[i]));
      xs = xs.map((x, k) => x + dx[k]);
      ys = ys.map((y, k) => y + dy[k]);
    }
    const box = { ch, xs, ys, sizes, w: 0, h: 0 };
    ch.forEach((_, k) => {
      box.w = Math.max(box.w, xs[k] + sizes[k][0]);
      box.h = Math.max(box.h, ys[k] + sizes[k][1]);
    });
    boxes.set(c, box);
    return box;
  }
  const r1 = (v) => Math.round(v * 10) / 10;
  const nodes = [];
  function place(c, ox, oy) {
    const box = layout(c);
    box.ch.forEach((i, k) => {
      const x = ox + box.xs[k];
      const y = oy + box.ys[k];
      const [w, h] = box.sizes[k];
      const entry = { id: S.id[i], kind: S.kind[i], name: S.name[i], label: S.label[i], x: r1(x), y: r1(y), w: r1(w), h: r1(h), color: S.color[i], sub: S.sub[i], stale: S.stale ? S.stale[i] : 0 };
      if (S.mix[i]) entry.mix = S.mix[i];
      if (S.kind[i] !== "node") entry.open = open.has(i);
      nodes.push(entry);
      if (open.has(i)) place(i, x + pad, y + header);
    });
  }
  const root = layout(-1);
  place(-1, 0, 0);
  // Each node's visible item: itself, or the outermost closed container around it.
  const repOf = new Map();
  const rep = (i) => {
    if (repOf.has(i)) return repOf.get(i);
    const chain = [];
    for (let p = S.parent[i]; p !== -1; p = S.parent[p]) chain.push(p);
    let r = i;
    for (let k = chain.length - 1; k >= 0; k--) {
      if (!open.has(chain[k])) {
        r = chain[k];
        break;
      }
    }
    repOf.set(i, r);
    return r;
  };
  const hitIds = new Set();
  for (const name of hits) {
    const i = T.nodeIndex.get(name);
    if (i !== undefined) hitIds.add(S.id[rep(i)]);
  }
  for (const entry of nodes) if (hitIds.has(entry.id)) entry.hit = true;
  const merged = new Map();
  for (const link of S.links) {
    const a = rep(link[0]);
    const b = rep(link[1]);
    if (a === b) continue;
    const key = a + ":" + b;
    if (!merged.has(key)) merged.set(key, { a, b, links: [] });
    merged.get(key).links.push(link);
  }
  const edges = [];
  for (const { a, b, links } of merged.values()) {
    const tensors = [...new Set(links.filter((l) => l[2] >= 0).map((l) => l[2]))];
    const edge = { s: S.id[a], t: S.id[b], n: links.length };
    if (!tensors.length) edge.ctl = true;
    else if (tensors.length === 1) edge.label = S.shapes[tensors[0]];
    else edge.label = `${tensors.length} tensors`;
    const crossing = [
      ...new Set(
        links.filter((l) => S.key[l[0]] !== S.key[l[1]]).map((l) => JSON.stringify([S.keys[S.key[l[0]]], S.keys[S.key[l[1]]]])),
      ),
    ].sort();
    if (S.mode === "device" && crossing.length) edge.cross = crossing.slice(0, 4).map((p) => JSON.parse(p));
    edges.push(edge);
  }
  return { width: Math.round(root.w), height: Math.round(root.h), nodes, edges, mode: S.mode, legend: S.legend, total: S.total };
}

function infoHtml(info) {
  if (!info || !info.kind) return `<div class="cgv-hint">Click a node for its details; click a scope to open it.</div>`;
  const row = (k, v) => `<tr><td>${esc(k)}</td><td>${v}</td></tr>`;
  let h = `<h4>${esc(info.name)}</h4><table>`;
  if (info.kind === "node") {
    h += row("op", `<b>${esc(info.op)}</b> (${esc(info.family)})`);
    if (info.device) h += row("device", esc(info.device));
    if (info.reason) h += row("why", esc(info.reason));
    if (info.requested_device && !info.device) h += row("asked for", esc(info.requested_device));
    h += row("made in", esc(info.cell));
    for (const t of info.inputs) h += row("in", `${esc(t.name)} <b>${esc(t.shape)}</b> ${esc(t.dtype)}`);
    for (const t of info.outputs) {
      const to = t.consumers.length ? " → " + t.consumers.map(esc).join(", ") + (t.more ? ` +${t.more}` : "") : "";
      h += row("out", `${esc(t.name)} <b>${esc(t.shape)}</b> ${esc(t.dtype)}${to}`);
    }
    if (info.control_inputs.length) h += row("after", info.control_inputs.map(esc).join(", "));
    if (info.stale) h += row("stale", esc(info.stale));
  } else {
    h += row(info.kind, `${info.nodes.toLocaleString()} nodes${info.open ? " (open)" : ""}`);
    h += row("ops", info.ops.map(([op, n]) => `${esc(op)} ×${n}`).join(", "));
    if (info.devices) h += row("devices", info.devices.map(([d, n]) => `${esc(d)} ×${n}`).join("<br>"));
    if (info.stale) h += row("stale", esc(info.stale));
  }
  return h + "</table>";
}

function render({ model, el }) {
  if (!document.getElementById(STYLE_ID)) {
    const style = document.createElement("style");
    style.id = STYLE_ID;
    style.textContent = CSS;
    document.head.appendChild(style);
  }
  el.classList.add("cgv");
  el.innerHTML =
    `<div class="cgv-bar"><input class="cgv-search" type="search" placeholder="search names or op types">` +
    `<span class="cgv-count"></span><button class="cgv-fit" title="fit the drawing to the view">fit</button>` +
    `<div class="cgv-legend"></div></div><div class="cgv-error"></div>` +
    `<div class="cgv-main"><svg class="cgv-svg" xmlns="http://www.w3.org/2000/svg"><defs>` +
    `<marker id="cgv-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse">` +
    `<path d="M0,0 L10,5 L0,10 z" fill="#888"/></marker></defs><g class="cgv-vp"></g></svg>` +
    `<div class="cgv-panel"><div class="cgv-matches"></div><div class="cgv-info"></div></div></div>`;
  const $ = (sel) => el.querySelector(sel);
  const svg = $(".cgv-svg");
  const vp = $(".cgv-vp");
  const view = { x: 10, y: 10, k: 1 };
  let fitted = false;
  let anchor = null; // keep the clicked box where it was when the layout changes
  let at = new Map();
  let paints = 0;

  const send = (msg) => {
    try {
      model.send(msg);
    } catch (err) {
      // A static page has no kernel to answer; it shows the last state only.
      $(".cgv-error").textContent = "This view is static (no kernel): run the notebook to explore it.";
    }
  };
  const apply = () => vp.setAttribute("transform", `translate(${view.x},${view.y}) scale(${view.k})`);
  const fit = (readable = false) => {
    const scene = shownScene;
    const w = svg.clientWidth || 800;
    const h = svg.clientHeight || model.get("height");
    const k = Math.min(1.5, (w - 20) / Math.max(1, scene.width || 1), (h - 20) / Math.max(1, scene.height || 1));
    // The first view keeps labels legible (a tall graph starts at its top); the fit button shows it all.
    view.k = readable ? Math.min(1, Math.max(k, 0.6)) : k;
    view.x = Math.max(10, (w - (scene.width || 0) * view.k) / 2);
    view.y = 10;
    apply();
  };

  // The structure, indexed; the scene drawn last (what a click finds its boxes in).
  let T = null;
  let structureSeen = null;
  const currentScene = () => {
    const S = model.get("structure");
    if (!S || !S.id) return model.get("scene") || {};
    if (S !== structureSeen) {
      T = indexStructure(S);
      structureSeen = S;
      el.dataset.structure = "1"; // from now on scopes open here, without the kernel
    }
    const open = new Set();
    for (const name of model.get("expanded") || []) if (T.byName.has(name)) open.add(T.byName.get(name));
    return computeScene(T, open, model.get("hits") || []);
  };
  let shownScene = {};

  // Open or close a scope here, at once; Python hears of it as a change of `expanded` (and of `selected`).
  function toggleHere(n) {
    const i = T.byName.get(n.name);
    const names = new Set(model.get("expanded") || []);
    if (n.open) names.delete(n.name);
    else for (let p = i; p !== -1; p = T.S.parent[p]) names.add(T.S.name[p]);
    model.set("expanded", [...names].sort());
    if (T.S.own[i]) model.set("selected", n.name);
    try {
      model.save_changes();
    } catch (err) {
      // A static page: it opens the scope all the same, and has no kernel to tell.
    }
  }

  function draw() {
    const scene = currentScene();
    shownScene = scene;
    const nodes = scene.nodes || [];
    const selected = model.get("selected");
    at = new Map(nodes.map((n) => [n.id, n]));
    const open = nodes.filter((n) => n.open).map((n) => box(n, selected));
    const closed = nodes.filter((n) => !n.open).map((n) => box(n, selected));
    const edges = (scene.edges || []).map((e) => edge(e, at));
    vp.innerHTML = open.join("") + edges.join("") + closed.join("");
    svg.style.height = model.get("height") + "px";
    const shown = nodes.filter((n) => !n.open).length;
    // Stale nodes below the first view's fold (an optimizer's scope under the model) were only seen by scrolling:
    // the header counts them. A closed box counts the stale nodes beneath it; an open one's are drawn inside it.
    const stale = nodes.filter((n) => !n.open).reduce((sum, n) => sum + (n.stale || 0), 0);
    $(".cgv-count").textContent =
      `${shown.toLocaleString()} shown of ${(scene.total || 0).toLocaleString()} nodes` +
      (stale ? ` · ${stale.toLocaleString()} stale (dashed red): re-run the cells that made them` : "");
    $(".cgv-legend").innerHTML = (scene.legend || [])
      .filter((l) => l.count > 0 || scene.mode === "device")
      .map((l) => `<span title="${l.count} nodes"><i style="background:${l.color}"></i>${esc(l.label)}</span>`)
      .join("");
    if (!fitted && svg.clientWidth) {
      fit(true);
      fitted = true;
    } else if (anchor && at.has(anchor.id)) {
      const n = at.get(anchor.id);
      view.x = anchor.sx - n.x * view.k;
      view.y = anchor.sy - n.y * view.k;
      apply();
    } else {
      apply();
    }
    anchor = null;
    paints += 1;
    const count = paints;
    // Marked when the frame holding this drawing is about to be painted.
    requestAnimationFrame(() => performance.mark("cellgraph-graphview-paint", { detail: { paint: count, nodes: nodes.length } }));
  }

  function panel() {
    $(".cgv-info").innerHTML = infoHtml(model.get("info"));
    const matches = model.get("matches") || [];
    const query = model.get("query");
    $(".cgv-matches").innerHTML = query
      ? `<div class="cgv-hint" style="cursor:default">${matches.length ? matches.length + (matches.length >= 50 ? "+" : "") : "no"} match${matches.length === 1 ? "" : "es"}</div>` +
        matches.map((m) => `<div data-match="${esc(m)}">${esc(m)}</div>`).join("")
      : "";
    $(".cgv-error").textContent = model.get("error");
  }

  svg.addEventListener("click", (ev) => {
    if (moved) return;
    const g = ev.target.closest("[data-id]");
    if (!g) return;
    const n = at.get(g.dataset.id);
    if (!n) return;
    anchor = { id: n.id, sx: view.x + n.x * view.k, sy: view.y + n.y * view.k };
    // An open container toggles only from its header (HEADER = 26 in graph_layout.py), so clicks inside it reach its children.
    const top = svg.getBoundingClientRect().top;
    if (n.open && (ev.clientY - top - view.y) / view.k - n.y > 26) return;
    if (n.kind !== "node" && T && T.byName.get(n.name) !== undefined && model.get("structure")) toggleHere(n);
    else send({ type: n.kind === "node" ? "select" : "toggle", id: n.id });
  });
  $(".cgv-matches").addEventListener("click", (ev) => {
    const m = ev.target.closest("[data-match]");
    if (m) send({ type: "reveal", name: m.dataset.match });
  });
  let timer = null;
  $(".cgv-search").addEventListener("input", (ev) => {
    clearTimeout(timer);
    timer = setTimeout(() => send({ type: "search", query: ev.target.value }), 150);
  });
  $(".cgv-search").value = model.get("query");
  $(".cgv-fit").addEventListener("click", () => fit());

  // Pan by dragging, zoom with the wheel around the pointer.
  let drag = null;
  let moved = false;
  svg.addEventListener("pointerdown", (ev) => {
    drag = { x: ev.clientX, y: ev.clientY, vx: view.x, vy: view.y };
    moved = false;
  });
  svg.addEventListener("pointermove", (ev) => {
    if (!drag) return;
    const dx = ev.clientX - drag.x;
    const dy = ev.clientY - drag.y;
    if (!moved && Math.abs(dx) + Math.abs(dy) < 4) return;
    if (!moved) svg.setPointerCapture(ev.pointerId);
    moved = true;
    view.x = drag.vx + dx;
    view.y = drag.vy + dy;
    apply();
  });
  const end = () => {
    drag = null;
  };
  svg.addEventListener("pointerup", end);
  svg.addEventListener("pointercancel", end);
  svg.addEventListener(
    "wheel",
    (ev) => {
      ev.preventDefault();
      if (!(ev.ctrlKey || ev.metaKey)) {
        // A plain wheel (or two-finger swipe) pans; with Ctrl or Cmd (or a pinch) it zooms.
        view.x -= ev.deltaX;
        view.y -= ev.deltaY;
        apply();
        return;
      }
      const r = svg.getBoundingClientRect();
      const px = ev.clientX - r.left;
      const py = ev.clientY - r.top;
      const k = Math.min(4, Math.max(0.02, view.k * Math.exp(-ev.deltaY * 0.01)));
      view.x = px - ((px - view.x) * k) / view.k;
      view.y = py - ((py - view.y) * k) / view.k;
      view.k = k;
      apply();
    },
    { passive: false },
  );

  // One update from the kernel changes several traits at once: draw once for all of them.
  let pending = false;
  const redraw = () => {
    if (pending) return;
    pending = true;
    queueMicrotask(() => {
      pending = false;
      draw();
    });
  };
  const handlers = [
    ["change:scene", redraw],
    ["change:structure", redraw],
    ["change:expanded", redraw],
    ["change:hits", redraw],
    ["change:selected", redraw],
    ["change:height", redraw],
    ["change:info", panel],
    ["change:matches", panel],
    ["change:query", panel],
    ["change:error", panel],
  ];
  for (const [event, fn] of handlers) model.on(event, fn);
  draw();
  panel();
  // The first drawing may happen before the output area has a width; fit once it has one.
  if (!fitted) requestAnimationFrame(() => !fitted && svg.clientWidth && (fit(true), (fitted = true)));
  return () => {
    for (const [event, fn] of handlers) model.off(event, fn);
  };
}

export default { render };
