// Browser driver for tests/test_web_browser.py (not a `node --test` file): opens a running ComfyUI in headless
// Debian chromium through playwright-core, loads a workflow, queues it, waits for the run, drags the A/B wipe and
// steps the scrubber, takes screenshots, and prints what it measured as one JSON line. The Python test asserts.
//
//   node browser_ab_viewer.mjs --url http://127.0.0.1:PORT --workflow /api/workflow_templates/<pack>/<name>.json
//     --playwright <folder holding node_modules/playwright-core> --out <folder for screenshots>
//     [--empty-latent '{"width": 192, "height": 128, "frames": 17}']
import { createRequire } from "node:module";
import path from "node:path";
import { parseArgs } from "node:util";

const { values: opt } = parseArgs({
  options: {
    url: { type: "string" },
    workflow: { type: "string" },
    playwright: { type: "string" },
    out: { type: "string" },
    chromium: { type: "string", default: "/usr/bin/chromium" },
    timeout: { type: "string", default: "240" },
    // JSON {widget name: value} set on every LTX25EmptyLatent before queueing (the tiny set gets a small clip)
    "empty-latent": { type: "string", default: "{}" },
  },
});
const timeoutMs = Number(opt.timeout) * 1000;
const { chromium } = createRequire(path.join(path.resolve(opt.playwright), "package.json"))("playwright-core");

// The flags the project uses for Debian's chromium: no sandbox (root), no GPU, nothing phoning home.
const FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
  "--disable-component-update", "--disable-sync", "--no-first-run"];

// A fresh ComfyUI user has not "completed the tutorial", so the frontend opens its template browser as a modal
// over the canvas, which would swallow the wipe drag. Mark it done through the settings route first.
await fetch(new URL("api/settings/Comfy.TutorialCompleted", opt.url), { method: "POST", body: "true" });

const result = { console_errors: [], page_errors: [] };
const browser = await chromium.launch({ executablePath: opt.chromium, headless: true, args: FLAGS });
try {
  const page = await browser.newPage({ viewport: { width: 1600, height: 1000 } });
  page.on("console", (m) => m.type() === "error" && result.console_errors.push(m.text()));
  page.on("pageerror", (e) => result.page_errors.push(String(e?.stack ?? e)));
  await page.goto(opt.url, { waitUntil: "domcontentloaded", timeout: 60_000 });
  await page.waitForFunction(() => window.comfyAPI?.app?.app?.graph && window.comfyAPI.api.api.clientId,
    null, { timeout: 60_000 });
  result.extension_loaded = await page.evaluate(
    () => window.comfyAPI.app.app.extensions.some((e) => e.name === "LTX25.Canvas"));

  // 1. Load the workflow the way the template browser does, then queue it through the frontend (graphToPrompt).
  Object.assign(result, await page.evaluate(async ({ workflow, timeoutMs, emptyLatent }) => {
    const { app } = window.comfyAPI.app, { api } = window.comfyAPI.api;
    const graph = await (await fetch(workflow)).json();
    await app.loadGraphData(graph, true, true, null, { showMissingNodesDialog: false, showMissingModelsDialog: false });
    const known = new Set(Object.keys(window.LiteGraph.registered_node_types));
    const missing_types = app.graph.nodes.map((n) => n.type).filter((t) => !known.has(t));
    // Size the clip through the widgets, as a person would; a name that is no widget is an error, not a no-op.
    for (const node of app.graph.nodes.filter((n) => n.comfyClass === "LTX25EmptyLatent")) {
      for (const [name, value] of Object.entries(emptyLatent)) {
        const widget = node.widgets?.find((w) => w.name === name);
        if (!widget) throw new Error(`LTX25EmptyLatent ${node.id} has no widget ${name}`);
        widget.value = value;
      }
    }
    const finished = new Promise((resolve) => {
      api.addEventListener("execution_success", () => resolve({ status: "success" }), { once: true });
      api.addEventListener("execution_error", (e) => resolve({ status: "error", error: e.detail }), { once: true });
      setTimeout(() => resolve({ status: "timeout" }), timeoutMs);
    });
    // The server drops every output whose inputs fail validation and still runs the rest to "success", so keep
    // its node_errors and which nodes sent "executed": a dropped compare node never gets its viewer.
    const executed_nodes = [];
    api.addEventListener("executed", (e) => executed_nodes.push(String(e.detail.display_node ?? e.detail.node)));
    const queue = api.queuePrompt;
    let response = null;
    api.queuePrompt = async function (...args) { return (response = await queue.apply(this, args)); };
    try {
      await app.queuePrompt(0, 1);
    } finally {
      api.queuePrompt = queue;
    }
    const compare_ids = app.graph.nodes.filter((n) => n.comfyClass === "LTX25DecoderCompare").map((n) => String(n.id));
    return { missing_types, run: await finished, node_errors: response?.node_errors ?? {}, executed_nodes,
      compare_ids };
  }, { workflow: opt.workflow, timeoutMs, emptyLatent: JSON.parse(opt["empty-latent"]) }));
  if (result.run.status !== "success") throw new Error(`run ended: ${JSON.stringify(result.run).slice(0, 2000)}`);
  if (Object.keys(result.node_errors).length) {
    throw new Error(`the server refused nodes of the graph (their outputs never ran): ${
      JSON.stringify(result.node_errors).slice(0, 2000)}`);
  }
  const unexecuted = result.compare_ids.filter((id) => !result.executed_nodes.includes(id));
  if (unexecuted.length) {
    throw new Error(`the compare node(s) ${unexecuted} sent no "executed" message; executed: ${result.executed_nodes}`);
  }

  // 2. Bring the compare node into view at zoom 1 (DOM widgets hide when zoomed out or off screen).
  await page.waitForSelector(".ltx25-ab-stage", { state: "attached", timeout: 30_000 });
  await page.evaluate(() => {
    const { app } = window.comfyAPI.app;
    const node = app.graph.nodes.find((n) => n.comfyClass === "LTX25DecoderCompare");
    app.canvas.ds.scale = 1;
    app.canvas.centerOnNode(node);
    app.canvas.bringToFront(node);
    app.canvas.setDirty(true, true);
  });
  const stage = page.locator(".ltx25-ab-stage");
  await stage.waitFor({ state: "visible", timeout: 30_000 });
  await page.evaluate(() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r))));
  const covering = await page.evaluate(() => {
    const box = document.querySelector(".ltx25-ab-stage").getBoundingClientRect();
    const hit = document.elementFromPoint(box.x + box.width / 2, box.y + box.height / 2);
    return hit?.closest(".ltx25-ab") ? null : `${hit?.tagName}.${hit?.className}`;
  });
  if (covering) throw new Error(`the viewer is covered by ${covering}; a dialog or another node is on top`);
  await page.waitForFunction(() => {
    const node = window.comfyAPI.app.app.graph.nodes.find((n) => n.comfyClass === "LTX25DecoderCompare");
    const frames = [...node.ltx25Viewer.framesA, ...node.ltx25Viewer.framesB];
    return frames.length > 0 && frames.every((img) => img.complete && img.naturalWidth > 0);
  }, null, { timeout: 30_000 });

  const measure = () => page.evaluate(() => {
    const root = document.querySelector(".ltx25-ab");
    const canvas = root.querySelector(".ltx25-ab-canvas");
    const pixels = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
    let painted = 0;
    for (let i = 3; i < pixels.length; i += 4) painted += pixels[i] > 0;
    return {
      split: Number(root.dataset.split),
      handle_x: root.querySelector(".ltx25-ab-handle").getBoundingClientRect().x,
      painted_fraction: painted / (pixels.length / 4),
      caption: root.querySelector(".ltx25-ab-caption").textContent,
    };
  });

  // 3. Drag the wipe left, then right; each drag must move the split and the handle with the pointer.
  const box = await stage.boundingBox();
  const y = box.y + box.height / 2;
  const drag = async (fromFraction, toFraction) => {
    await page.mouse.move(box.x + box.width * fromFraction, y);
    await page.mouse.down();
    await page.mouse.move(box.x + box.width * toFraction, y, { steps: 8 });
    await page.mouse.up();
    await page.evaluate(() => new Promise((r) => requestAnimationFrame(() => r())));
    return measure();
  };
  result.before = await measure();
  result.after_left = await drag(0.5, 0.2);
  result.after_right = await drag(0.2, 0.85);
  await page.screenshot({ path: path.join(opt.out, "page.png") });
  await page.locator(".ltx25-ab").screenshot({ path: path.join(opt.out, "ab_viewer.png") });

  // 4. One step of the scrubber by keyboard (a real input event), then the node's table and the decoder panels.
  const scrub = page.locator(".ltx25-ab-scrub");
  result.scrub_max = Number(await scrub.getAttribute("max"));
  await scrub.focus();
  await page.keyboard.press("ArrowRight");
  result.after_scrub = await measure();
  Object.assign(result, await page.evaluate(() => {
    const text = (el) => el?.textContent ?? null;
    const decoders = window.comfyAPI.app.app.graph.nodes
      .filter((n) => ["LTX25ConvVAEDecode", "LTX25DiffusionVAEDecode"].includes(n.comfyClass))
      .map((n) => ({
        comfy_class: n.comfyClass, color: n.color, bgcolor: n.bgcolor,
        badges: n.badges.map((b) => (typeof b === "function" ? b() : b).text),
        panel: text(n.ltx25Stats),
        // a display panel must stay out of widgets_values, or every widget after it shifts on reload
        panel_serializes: n.widgets.some((w) => w.name === "ltx25_decode_stats" && w.serialize !== false),
      }));
    const rows = [...document.querySelectorAll(".ltx25-ab-table tr")].map((tr) =>
      [...tr.children].map((c) => c.textContent));
    return { table_rows: rows, decoders };
  }));
} catch (error) {
  result.error = String(error?.stack ?? error);
} finally {
  await browser.close();
}
console.log(JSON.stringify(result));
