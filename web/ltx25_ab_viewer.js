// LTX-2.5 canvas extension: an A/B wipe viewer on the decoder compare node, the last run's figures on both decode
// nodes, and colours + badges that tell the conv and diffusion decoder paths apart.
// Everything arrives through the nodes' `ui` outputs (frames as PNGs in ComfyUI's temp folder, served by /view).
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";
import { BADGE_FG, DECODER_NODES, styleForNode } from "./lib/decoder_style.js";
import { decodeStatsRows, frameCaption, reportTable } from "./lib/format.js";
import { frameIndex, loadWithRetry, readAbPayload, viewRoute } from "./lib/frames.js";
import { dividerX, fitRect, splitFromPointer, wipeRects } from "./lib/wipe.js";

const COMPARE_NODE = "LTX25DecoderCompare";
const VIEWER_WIDGET = "ltx25_ab_viewer";
const STATS_WIDGET = "ltx25_decode_stats";
const VIEWER_MIN_HEIGHT = 420;
const VIEWER_MIN_WIDTH = 460;

const CSS = `
.ltx25-ab { display: flex; flex-direction: column; gap: 4px; height: 100%; box-sizing: border-box;
  font: 11px/1.35 sans-serif; color: var(--input-text, #ddd); }
.ltx25-ab-stage { position: relative; flex: 1 1 auto; min-height: 120px; background: #111; cursor: ew-resize;
  touch-action: none; user-select: none; outline: none; }
.ltx25-ab-stage:focus-visible { box-shadow: 0 0 0 2px #6aa0e0; }
.ltx25-ab-canvas { position: absolute; inset: 0; width: 100%; height: 100%; }
.ltx25-ab-handle { position: absolute; top: 0; bottom: 0; width: 2px; margin-left: -1px; background: #fff;
  box-shadow: 0 0 3px #000; pointer-events: none; }
.ltx25-ab-label { position: absolute; top: 4px; padding: 1px 5px; background: rgba(0,0,0,.65); color: #fff;
  border-radius: 3px; pointer-events: none; }
.ltx25-ab-label-a { left: 4px; } .ltx25-ab-label-b { right: 4px; }
.ltx25-ab-controls { display: flex; align-items: center; gap: 6px; }
.ltx25-ab-scrub { flex: 1 1 auto; min-width: 60px; }
.ltx25-ab-caption { flex: 0 1 auto; min-width: 0; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
.ltx25-ab-error { color: #f88; }
.ltx25-table { border-collapse: collapse; width: 100%; }
.ltx25-table th, .ltx25-table td { padding: 1px 4px; border-bottom: 1px solid var(--border-color, #444);
  text-align: left; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; max-width: 180px; }
.ltx25-table th { font-weight: 600; }
.ltx25-stats { font: 11px/1.35 sans-serif; color: var(--input-text, #ddd); }
`;

function injectStyle() {
  if (document.getElementById("ltx25-canvas-style")) return;
  const style = document.createElement("style");
  style.id = "ltx25-canvas-style";
  style.textContent = CSS;
  document.head.append(style);
}

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

/** Fill a <table> from a header row and body rows; a two-cell body row spans the value over the columns. */
function renderTable(table, head, rows) {
  table.replaceChildren();
  const width = head ? head.length : 2;
  if (head) {
    const tr = table.createTHead().insertRow();
    for (const cell of head) tr.append(el("th", "", cell));
  }
  const body = table.createTBody();
  for (const [label, ...values] of rows) {
    const tr = body.insertRow();
    tr.append(el("th", "", label));
    for (const value of values) {
      const td = el("td", "", value);
      td.title = value;
      if (values.length === 1) td.colSpan = width - 1;
      tr.append(td);
    }
  }
}

/** Give a node room for a DOM widget that was just added or refilled. */
function growToFit(node, minWidth) {
  const [w, h] = node.computeSize();
  node.setSize([Math.max(node.size[0], w, minWidth), Math.max(node.size[1], h)]);
  node.setDirtyCanvas(true, true);
}

/** Add a display-only DOM widget, not serialized: it stays out of widgets_values and out of the queued prompt. */
function addPanel(node, name, element, minHeight) {
  const widget = node.addDOMWidget(name, "ltx25_panel", element, { getMinHeight: minHeight });
  widget.serialize = false;
  return widget;
}

class AbViewer {
  constructor() {
    this.split = 0.5;
    this.index = 0;
    this.framesA = [];
    this.framesB = [];
    this.sourceIndices = null;
    this.report = null;

    this.root = el("div", "ltx25-ab");
    this.stage = el("div", "ltx25-ab-stage");
    this.stage.tabIndex = 0;
    this.stage.title = "Drag to move the wipe (arrow keys too)";
    this.canvas = el("canvas", "ltx25-ab-canvas");
    this.handle = el("div", "ltx25-ab-handle");
    this.labelA = el("div", "ltx25-ab-label ltx25-ab-label-a");
    this.labelB = el("div", "ltx25-ab-label ltx25-ab-label-b");
    this.stage.append(this.canvas, this.handle, this.labelA, this.labelB);

    this.scrub = el("input", "ltx25-ab-scrub");
    Object.assign(this.scrub, { type: "range", min: "0", max: "0", step: "1", value: "0" });
    this.scrub.title = "Frame";
    this.caption = el("span", "ltx25-ab-caption");
    const controls = el("div", "ltx25-ab-controls");
    controls.append(this.scrub, this.caption);

    this.error = el("div", "ltx25-ab-error");
    this.table = el("table", "ltx25-table ltx25-ab-table");
    this.root.append(this.stage, controls, this.error, this.table);
    this.listen();
  }

  listen() {
    const follow = (event) => this.setSplit(this.splitAt(event.clientX));
    this.stage.addEventListener("pointerdown", (event) => {
      event.preventDefault(); // no text selection or native image drag while wiping
      this.stage.focus();
      this.stage.setPointerCapture(event.pointerId);
      follow(event);
    });
    this.stage.addEventListener("pointermove", (event) => {
      if (this.stage.hasPointerCapture(event.pointerId)) follow(event);
    });
    this.stage.addEventListener("keydown", (event) => {
      const step = { ArrowLeft: -0.05, ArrowRight: 0.05 }[event.key];
      if (step === undefined) return;
      event.preventDefault();
      this.setSplit(Math.min(1, Math.max(0, this.split + step)));
    });
    this.scrub.addEventListener("input", () => this.setFrame(this.scrub.value));
    new ResizeObserver(() => this.draw()).observe(this.stage);
  }

  /** Split under the pointer, measured over the drawn image (the letterbox bars pin it at 0 or 1). */
  splitAt(clientX) {
    const box = this.stage.getBoundingClientRect();
    const fit = this.fit() ?? { x: 0, w: box.width };
    return splitFromPointer(clientX, box.left + fit.x, fit.w);
  }

  /** Where the current A frame lands in the stage (CSS pixels), or null before it has loaded. */
  fit() {
    const image = this.framesA[this.index];
    if (!image?.naturalWidth) return null;
    return fitRect(image.naturalWidth, image.naturalHeight, this.stage.clientWidth, this.stage.clientHeight);
  }

  setSplit(split) {
    this.split = split;
    this.root.dataset.split = split.toFixed(4);
    this.draw();
  }

  setFrame(value) {
    this.index = frameIndex(value, this.framesA.length);
    this.scrub.value = String(this.index);
    this.caption.textContent = frameCaption(this.report, this.index, this.framesA.length,
      this.sourceIndices?.[this.index]);
    this.caption.title = this.caption.textContent;
    this.draw();
  }

  show(message) {
    this.report = message?.ltx25_report?.[0] ?? null;
    const payload = readAbPayload(message?.ltx25_ab?.[0], this.report?.frames);
    this.error.textContent = payload.error ?? "";
    if (payload.error) {
      this.framesA = this.framesB = [];
      this.sourceIndices = null;
      this.table.replaceChildren();
      this.draw();
      return;
    }
    const runKey = Date.now().toString(36);
    const shown = (this.shown = (this.shown ?? 0) + 1);  // a later message stops this one's retries
    const load = (ref) => {
      const image = new Image();
      image.onload = () => this.draw();
      return loadWithRetry(image, (attempt) => attempt && shown !== this.shown ? null
        : api.apiURL(viewRoute(ref, attempt ? `${runKey}.${attempt}` : runKey)));
    };
    this.framesA = payload.framesA.map(load);
    this.framesB = payload.framesB.map(load);
    this.sourceIndices = payload.sourceIndices;
    this.labelA.textContent = `A: ${payload.labelA}`;
    this.labelB.textContent = `B: ${payload.labelB}`;
    this.scrub.max = String(this.framesA.length - 1);
    this.scrub.disabled = this.framesA.length < 2;
    const { head, rows } = reportTable(this.report, payload.labelA, payload.labelB);
    renderTable(this.table, head, rows);
    this.setFrame(Math.min(this.index, this.framesA.length - 1));
    this.setSplit(this.split);
  }

  draw() {
    const dpr = window.devicePixelRatio || 1;
    const w = this.stage.clientWidth, h = this.stage.clientHeight;
    if (this.canvas.width !== Math.round(w * dpr) || this.canvas.height !== Math.round(h * dpr)) {
      this.canvas.width = Math.round(w * dpr);
      this.canvas.height = Math.round(h * dpr);
    }
    const ctx = this.canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, h);
    const fit = this.fit() ?? { x: 0, y: 0, w, h };
    this.handle.style.left = `${dividerX(fit, this.split)}px`;
    const imageA = this.framesA[this.index], imageB = this.framesB[this.index];
    // Each side is cut from its own image, so a B of another pixel size (resize_b) still lines up on the fit.
    for (const [image, side] of [[imageA, "a"], [imageB, "b"]]) {
      if (!image?.naturalWidth || !fit.w) continue;
      const r = wipeRects(image.naturalWidth, image.naturalHeight, fit, this.split)[side];
      if (r) ctx.drawImage(image, r.sx, r.sy, r.sw, r.sh, r.dx, r.dy, r.dw, r.dh);
    }
  }
}

function showAbViewer(node, message) {
  if (!node.ltx25Viewer) {
    node.ltx25Viewer = new AbViewer();
    addPanel(node, VIEWER_WIDGET, node.ltx25Viewer.root, () => VIEWER_MIN_HEIGHT);
  }
  node.ltx25Viewer.show(message);
  growToFit(node, VIEWER_MIN_WIDTH);
}

function showDecodeStats(node, message) {
  const rows = decodeStatsRows(message?.ltx25_decode_stats?.[0]);
  if (!node.ltx25Stats) {
    node.ltx25Stats = el("div", "ltx25-stats");
    node.ltx25Stats.append(el("table", "ltx25-table ltx25-stats-table"));
    addPanel(node, STATS_WIDGET, node.ltx25Stats, () => 8 + 18 * Math.max(1, node.ltx25Stats.rowCount ?? 1));
  }
  node.ltx25Stats.rowCount = rows.length;
  renderTable(node.ltx25Stats.firstChild, null, rows.length ? rows : [["last run", "no figures"]]);
  growToFit(node, 0);
}

/** Run our handler after whatever onExecuted the node type already had. */
function chainOnExecuted(nodeType, handler) {
  const previous = nodeType.prototype.onExecuted;
  nodeType.prototype.onExecuted = function (message) {
    previous?.apply(this, arguments);
    handler(this, message);
  };
}

app.registerExtension({
  name: "LTX25.Canvas",
  setup() {
    injectStyle();
  },
  beforeRegisterNodeDef(nodeType, nodeData) {
    if (nodeData.name === COMPARE_NODE) chainOnExecuted(nodeType, showAbViewer);
    else if (nodeData.name in DECODER_NODES) chainOnExecuted(nodeType, showDecodeStats);
  },
  nodeCreated(node) {
    const style = styleForNode(node.comfyClass);
    if (!style) return;
    // Set at creation only: a workflow that saved its own colours overrides these when it is configured.
    node.color = style.color;
    node.bgcolor = style.bgcolor;
    const Badge = globalThis.LGraphBadge; // the frontend's global; older frontends lack it, then no badge
    if (Badge && Array.isArray(node.badges)) {
      node.badges.push(new Badge({ text: style.badge, fgColor: BADGE_FG, bgColor: style.badgeBg }));
    }
  },
});
