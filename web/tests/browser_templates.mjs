// Browser driver for tests/test_web_browser.py and tests/render_thumbnails.py (not a `node --test` file): opens a
// running ComfyUI in headless Debian chromium through playwright-core, looks at the pack's cards in the template
// browser, then for every template: loads it as the template browser does, measures what is on screen, queues it,
// waits for the run, measures every node's box (what DOM widgets and previews add included) and, where the graph has
// an A/B compare node, drags the wipe and steps the scrubber. Prints what it measured as one JSON line; the Python
// side asserts.
//
//   node browser_templates.mjs --url http://127.0.0.1:PORT --pack <pack folder> --templates '["title", ...]'
//     --playwright <folder holding node_modules/playwright-core> --out <folder for screenshots>
//     [--widgets '{"LTX25EmptyLatent": {"width": 192}}'] [--viewport 1920x960] [--thumbnails <folder>]
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";
import { parseArgs } from "node:util";

const { values: opt } = parseArgs({
  options: {
    url: { type: "string" },
    pack: { type: "string" },
    templates: { type: "string" },
    playwright: { type: "string" },
    out: { type: "string" },
    chromium: { type: "string", default: "/usr/bin/chromium" },
    timeout: { type: "string", default: "240" },
    viewport: { type: "string", default: "1920x960" },
    // JSON {node class: {widget name: value}} set before queueing (the tiny set gets a small clip)
    widgets: { type: "string", default: "{}" },
    // JSON {node class: fragment of a widget name}: what each such node shows after a run (awaited before measuring)
    grown: { type: "string", default: "{}" },
    // a folder: each template's canvas after its run, as <title>.jpg (the template browser's thumbnail)
    thumbnails: { type: "string", default: "" },
    "thumbnail-width": { type: "string", default: "512" },
  },
});
const timeoutMs = Number(opt.timeout) * 1000;
const [viewportWidth, viewportHeight] = opt.viewport.split("x").map(Number);
const templates = JSON.parse(opt.templates);
const { chromium } = createRequire(path.join(path.resolve(opt.playwright), "package.json"))("playwright-core");

// The flags the project uses for Debian's chromium: no sandbox (root), no GPU, nothing phoning home.
const FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
  "--disable-component-update", "--disable-sync", "--no-first-run"];
const COMPARE = "LTX25DecoderCompare";
const DECODERS = ["LTX25ConvVAEDecode", "LTX25DiffusionVAEDecode"];

// A fresh ComfyUI user has not "completed the tutorial", so the frontend opens its template browser as a modal
// over the canvas, which would swallow the wipe drag. Mark it done through the settings route first.
await fetch(new URL("api/settings/Comfy.TutorialCompleted", opt.url), { method: "POST", body: "true" });

const frames = (page, n = 2) => page.evaluate((n) => new Promise((resolve) => {
  const step = (left) => (left ? requestAnimationFrame(() => step(left - 1)) : resolve());
  step(n);
}), n);

/** Every node's box in graph units ([x, y, w, h], title bar included) and its DOM widgets' boxes, measured at
 * zoom 1 in a page large enough for the whole graph: the frontend hides DOM widgets when zoomed out or off screen. */
async function measureNodes(page) {
  const viewport = page.viewportSize();
  const view = await page.evaluate(() => {
    const { app } = window.comfyAPI.app;
    const boxes = [...app.graph.nodes.map((n) => n.boundingRect),
      ...app.graph.groups.map((g) => g._bounding ?? g.bounding)];
    const x0 = Math.min(...boxes.map((b) => b[0])), y0 = Math.min(...boxes.map((b) => b[1]));
    return { x0, y0, w: Math.max(...boxes.map((b) => b[0] + b[2])) - x0,
      h: Math.max(...boxes.map((b) => b[1] + b[3])) - y0,
      ds: { scale: app.canvas.ds.scale, offset: [...app.canvas.ds.offset] } };
  });
  const margin = 120;
  await page.setViewportSize({ width: Math.ceil(view.w + 2 * margin), height: Math.ceil(view.h + 2 * margin) });
  await page.evaluate(({ x0, y0, margin }) => {
    const { app } = window.comfyAPI.app;
    app.canvas.ds.scale = 1;
    app.canvas.ds.offset = [margin - x0, margin - y0];
    app.canvas.setDirty(true, true);
  }, { x0: view.x0, y0: view.y0, margin });
  await frames(page, 4);
  const nodes = await readNodes(page);
  await page.setViewportSize(viewport);
  await page.evaluate((ds) => {
    const { app } = window.comfyAPI.app;
    app.canvas.ds.scale = ds.scale;
    app.canvas.ds.offset = ds.offset;
    app.canvas.setDirty(true, true);
  }, view.ds);
  await frames(page, 4);
  return nodes;
}

const readNodes = (page) => page.evaluate(() => {
  const { app } = window.comfyAPI.app;
  const { LiteGraph } = window;
  const canvasBox = app.canvas.canvas.getBoundingClientRect();
  const { scale, offset } = app.canvas.ds;
  const toGraph = (r) => [(r.x - canvasBox.x) / scale - offset[0], (r.y - canvasBox.y) / scale - offset[1],
    r.width / scale, r.height / scale];
  return app.graph.nodes.map((n) => {
    const title = n.constructor.title_mode === LiteGraph.NO_TITLE ? 0 : LiteGraph.NODE_TITLE_HEIGHT;
    const height = n.flags?.collapsed ? 0 : n.size[1];
    const dom = (n.widgets ?? []).filter((w) => w.element?.isConnected).map((w) => {
      const style = getComputedStyle(w.element);
      const r = w.element.getBoundingClientRect();
      const visible = style.display !== "none" && style.visibility !== "hidden" && r.width > 0 && r.height > 0;
      return visible ? { name: w.name, box: toGraph(r) } : null;
    }).filter(Boolean);
    return { id: n.id, type: n.type, title: n.title, box: [n.pos[0], n.pos[1] - title, n.size[0], height + title],
      dom };
  });
});

/** What the screen shows right after loading: the view, detail level, nodes' screen boxes, the frontend's chrome. */
const measureOpen = (page) => page.evaluate(() => {
  const { app } = window.comfyAPI.app;
  const { scale, offset } = app.canvas.ds;
  const rect = (el) => { const r = el.getBoundingClientRect(); return [r.x, r.y, r.width, r.height]; };
  const minimap = document.querySelector(".litegraph-minimap");
  return {
    ds: { scale, offset: [...offset] },
    low_quality: app.canvas.low_quality,
    viewport: [window.innerWidth, window.innerHeight],
    // [x, y, w, h] on screen, title bar included
    screen: app.graph.nodes.map((n) => ({ id: n.id, title: n.title, box: [(n.pos[0] + offset[0]) * scale,
      (n.pos[1] - window.LiteGraph.NODE_TITLE_HEIGHT + offset[1]) * scale, n.size[0] * scale,
      (n.size[1] + window.LiteGraph.NODE_TITLE_HEIGHT) * scale] })),
    minimap: minimap && getComputedStyle(minimap).display !== "none" ? rect(minimap) : null,
    side_bar: [...document.querySelectorAll(".side-tool-bar-container")].map(rect),
    tabs: [...document.querySelectorAll(".workflow-tabs-container")].map(rect),
  };
});

/** The template browser's cards of our pack: title as shown, whether it is cut, the thumbnail as loaded, and the
 * HTTP status of each thumbnail the cards asked for (the frontend fetches them into blob: URLs). */
async function readCards(page) {
  const thumbnails = {};
  const onResponse = (r) => {
    const route = decodeURIComponent(new URL(r.url()).pathname);
    if (route.startsWith("/api/workflow_templates/") && route.endsWith(".jpg")) thumbnails[route] = r.status();
  };
  page.on("response", onResponse);
  await page.evaluate(() => window.comfyAPI.app.app.extensionManager.command.execute("Comfy.BrowseTemplates"));
  // the pack's entry under Extensions; dispatched, since the dialog keeps moving while its images load
  const entry = page.getByText(opt.pack, { exact: true }).first();
  await entry.waitFor({ state: "visible", timeout: 60_000 });
  await entry.dispatchEvent("click");
  await page.waitForSelector("[data-testid^='template-workflow-']", { timeout: 30_000 });
  await page.waitForFunction(() => [...document.querySelectorAll("[data-testid^='template-workflow-']")]
    .every((card) => card.querySelector("img")?.complete), null, { timeout: 30_000 });
  const cards = await page.evaluate(() => [...document.querySelectorAll("[data-testid^='template-workflow-']")]
    .map((card) => {
      const h3 = card.querySelector("h3");
      const img = card.querySelector("img");
      return { testid: card.dataset.testid, title: h3?.textContent ?? null,
        title_cut: h3 ? h3.scrollWidth > h3.clientWidth || h3.scrollHeight > h3.clientHeight + 1 : null,
        thumbnail: img ? { src: img.currentSrc || img.src, width: img.naturalWidth } : null };
    }));
  await page.screenshot({ path: path.join(opt.out, "template_cards.png") });
  page.off("response", onResponse);
  await page.keyboard.press("Escape");
  await page.waitForSelector("[data-testid^='template-workflow-']", { state: "detached", timeout: 15_000 });
  return { cards, thumbnails };
}

/** Load one template (as the template browser does), size it for the tiny set, queue it, wait for the run. */
async function loadAndRun(page, title, runIndex) {
  await fetch(new URL("api/free", opt.url), { method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ unload_models: true, free_memory: true }) });
  const url = `/api/workflow_templates/${encodeURIComponent(opt.pack)}/${encodeURIComponent(title)}.json`;
  await page.evaluate(async ({ url, title }) => {
    const { app } = window.comfyAPI.app;
    const graph = await (await fetch(url)).json();
    await app.loadGraphData(graph, true, true, title, { openSource: "template" });
  }, { url, title });
  await frames(page, 3);
  const opened = await measureOpen(page);
  // The prompt the frontend queues with "Upsample x2" and "Stage 2" (nodes 11, 12) bypassed, as the templates'
  // two_stage note says, beside the one it queues as opened; the modes are put back before the run.
  const bypass = await page.evaluate(async () => {
    const { app } = window.comfyAPI.app;
    const before = (await app.graphToPrompt()).output;
    const stage = [11, 12].map((id) => app.graph.getNodeById(id)).filter(Boolean);
    for (const node of stage) node.mode = 4;
    try {
      return { bypassed: stage.map((n) => String(n.id)), before, after: (await app.graphToPrompt()).output };
    } finally {
      for (const node of stage) node.mode = 0;
    }
  });
  await page.screenshot({ path: path.join(opt.out, `${title.replace(/\W+/g, "_")}_open.png`) });
  const run = await page.evaluate(async ({ timeoutMs, widgets, seed }) => {
    const { app } = window.comfyAPI.app, { api } = window.comfyAPI.api;
    const known = new Set(Object.keys(window.LiteGraph.registered_node_types));
    const missing_types = app.graph.nodes.map((n) => n.type).filter((t) => !known.has(t));
    // Set the values through the widgets, as a person would; a name that is no widget is an error, not a no-op.
    for (const node of app.graph.nodes) {
      for (const [name, value] of Object.entries(widgets[node.comfyClass] ?? {})) {
        const widget = node.widgets?.find((w) => w.name === name);
        if (!widget) throw new Error(`${node.comfyClass} ${node.id} has no widget ${name}`);
        widget.value = value;
      }
      // A seed of this run's own, so nothing comes from ComfyUI's cache of an earlier template (a cached decode
      // sends no "executed" and shows no figures); /free drops the cache too, but only when its worker gets to it.
      for (const widget of node.widgets ?? []) if (widget.name === "seed") widget.value = seed;
    }
    const finished = new Promise((resolve) => {
      api.addEventListener("execution_success", () => resolve({ status: "success" }), { once: true });
      api.addEventListener("execution_error", (e) => resolve({ status: "error", error: e.detail }), { once: true });
      setTimeout(() => resolve({ status: "timeout" }), timeoutMs);
    });
    // The server drops every output whose inputs fail validation and still runs the rest to "success", so keep
    // its node_errors and which nodes sent "executed": a dropped compare node never gets its viewer.
    const executed_nodes = [];
    const onExecuted = (e) => executed_nodes.push(String(e.detail.display_node ?? e.detail.node));
    api.addEventListener("executed", onExecuted);
    const queue = api.queuePrompt;
    let response = null;
    api.queuePrompt = async function (...args) { return (response = await queue.apply(this, args)); };
    try {
      await app.queuePrompt(0, 1);
    } finally {
      api.queuePrompt = queue;
    }
    const status = await finished;
    api.removeEventListener("executed", onExecuted);
    const output_ids = app.graph.nodes.filter((n) => n.constructor.nodeData?.output_node).map((n) => String(n.id));
    return { missing_types, status, node_errors: response?.node_errors ?? {}, executed_nodes, output_ids,
      compare_ids: app.graph.nodes.filter((n) => n.comfyClass === "LTX25DecoderCompare").map((n) => String(n.id)) };
  }, { timeoutMs, widgets: JSON.parse(opt.widgets), seed: 1000 + runIndex });
  return { opened, run, bypass };
}

/** After a run: wait until the outputs' previews are there and loaded and no node has changed size for a second,
 * so the boxes measured are the ones a person sees. */
async function settle(page) {
  await page.waitForFunction((grown) => window.comfyAPI.app.app.graph.nodes.every((n) => !(n.comfyClass in grown)
    || (n.widgets ?? []).some((w) => w.name?.includes(grown[n.comfyClass]) && w.element?.isConnected)),
  JSON.parse(opt.grown), { timeout: 60_000 }).catch(() => {});  // the test names what is missing
  const sizes = () => page.evaluate(() => JSON.stringify(window.comfyAPI.app.app.graph.nodes.map((n) =>
    [n.id, Math.round(n.size[0]), Math.round(n.size[1]), (n.widgets ?? []).length])));
  let last = null, stableSince = Date.now();
  const start = Date.now();
  while (Date.now() - start < 30_000) {
    await page.waitForTimeout(250);
    const now = await sizes();
    const loaded = await page.evaluate(() => [...document.querySelectorAll("video")].every((v) => v.readyState >= 1)
      && [...document.querySelectorAll("img")].every((i) => i.complete));
    if (now !== last || !loaded) stableSince = Date.now();
    last = now;
    if (Date.now() - stableSince >= 1000 && Date.now() - start >= 2000) break;
  }
  await frames(page, 2);
}

/** The viewer at the template's own view, before anything is clicked: is any point of it covered? */
const viewerCovered = (page) => page.evaluate(() => {
  const stage = document.querySelector(".ltx25-ab-stage");
  if (!stage) return ["no viewer stage"];
  const r = stage.getBoundingClientRect();
  if (!(r.width > 0 && r.height > 0) || !stage.checkVisibility()) {
    return ["the viewer is not shown (zoomed out below the frontend's detail level, or off screen)"];
  }
  const covered = [];
  for (const [fx, fy] of [[0.5, 0.5], [0.1, 0.1], [0.9, 0.1], [0.1, 0.9], [0.9, 0.9]]) {
    const hit = document.elementFromPoint(r.x + r.width * fx, r.y + r.height * fy);
    if (!hit?.closest(".ltx25-ab")) covered.push(`${fx},${fy}: ${hit?.tagName}.${String(hit?.className).slice(0, 80)}`);
  }
  return covered;
});

/** A thumbnail of the canvas as the run left it: the graph's groups, clipped, scaled down, as JPEG. */
async function thumbnail(page, title) {
  const clip = await page.evaluate(() => {
    const { app } = window.comfyAPI.app;
    const { scale, offset } = app.canvas.ds;
    const boxes = app.graph.groups.map((g) => g._bounding ?? g.bounding);
    const x0 = Math.min(...boxes.map((b) => b[0])), y0 = Math.min(...boxes.map((b) => b[1]));
    const x1 = Math.max(...boxes.map((b) => b[0] + b[2])), y1 = Math.max(...boxes.map((b) => b[1] + b[3]));
    return { x: (x0 + offset[0]) * scale, y: (y0 + offset[1]) * scale, width: (x1 - x0) * scale,
      height: (y1 - y0) * scale };
  });
  // toasts ("Job completed") float over the canvas; they are no part of the template
  await page.addStyleTag({ content: ".p-toast { display: none !important; }" });
  await frames(page, 2);
  const png = await page.screenshot({ clip, type: "png" });
  const jpeg = await page.evaluate(async ({ data, width }) => {
    const bitmap = await createImageBitmap(await (await fetch(`data:image/png;base64,${data}`)).blob());
    const canvas = new OffscreenCanvas(width, Math.round(bitmap.height * width / bitmap.width));
    const ctx = canvas.getContext("2d");
    ctx.imageSmoothingQuality = "high";
    ctx.drawImage(bitmap, 0, 0, canvas.width, canvas.height);
    const blob = await canvas.convertToBlob({ type: "image/jpeg", quality: 0.82 });
    return new Promise((resolve) => {
      const reader = new FileReader();
      reader.onload = () => resolve(reader.result.split(",")[1]);
      reader.readAsDataURL(blob);
    });
  }, { data: png.toString("base64"), width: Number(opt["thumbnail-width"]) });
  fs.writeFileSync(path.join(opt.thumbnails, `${title}.jpg`), Buffer.from(jpeg, "base64"));
}

/** Bring the compare node into view at zoom 1, drag the wipe, step the scrubber; the A/B figures. */
async function exerciseViewer(page, title) {
  const result = {};
  await page.evaluate(() => {
    const { app } = window.comfyAPI.app;
    const node = app.graph.nodes.find((n) => n.comfyClass === "LTX25DecoderCompare");
    app.canvas.ds.scale = 1;
    app.canvas.centerOnNode(node);
    app.canvas.setDirty(true, true);
  });
  const stage = page.locator(".ltx25-ab-stage");
  await stage.waitFor({ state: "visible", timeout: 30_000 });
  await frames(page);
  result.covered_at_zoom_1 = await viewerCovered(page);
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
  // Drag the wipe left, then right; each drag must move the split and the handle with the pointer.
  const box = await stage.boundingBox();
  const y = box.y + box.height / 2;
  const drag = async (fromFraction, toFraction) => {
    await page.mouse.move(box.x + box.width * fromFraction, y);
    await page.mouse.down();
    await page.mouse.move(box.x + box.width * toFraction, y, { steps: 8 });
    await page.mouse.up();
    await frames(page, 1);
    return measure();
  };
  result.before = await measure();
  result.after_left = await drag(0.5, 0.2);
  result.after_right = await drag(0.2, 0.85);
  const shot = path.join(opt.out, `${title.replace(/\W+/g, "_")}_viewer.png`);
  await page.locator(".ltx25-ab").screenshot({ path: shot });
  result.screenshot = shot;

  // One step of the scrubber by keyboard (a real input event), then the node's table and the decoder panels.
  const scrub = page.locator(".ltx25-ab-scrub");
  result.scrub_max = Number(await scrub.getAttribute("max"));
  await scrub.focus();
  await page.keyboard.press("ArrowRight");
  result.after_scrub = await measure();
  Object.assign(result, await page.evaluate((DECODERS) => {
    const text = (el) => el?.textContent ?? null;
    const decoders = window.comfyAPI.app.app.graph.nodes.filter((n) => DECODERS.includes(n.comfyClass))
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
  }, DECODERS));
  return result;
}

const result = { console_errors: [], page_errors: [], templates: {} };
const browser = await chromium.launch({ executablePath: opt.chromium, headless: true, args: FLAGS });
try {
  const page = await browser.newPage({ viewport: { width: viewportWidth, height: viewportHeight } });
  page.on("console", (m) => m.type() === "error" && result.console_errors.push(m.text()));
  page.on("pageerror", (e) => result.page_errors.push(String(e?.stack ?? e)));
  await page.goto(opt.url, { waitUntil: "domcontentloaded", timeout: 60_000 });
  // The frontend opens its own start-up graph once it is set up; a template loaded before that is replaced.
  await page.waitForFunction(() => window.comfyAPI?.app?.app?.graph?.nodes?.length > 0
    && window.comfyAPI.api.api.clientId, null, { timeout: 90_000 });
  await frames(page, 10);
  result.extension_loaded = await page.evaluate(
    () => window.comfyAPI.app.app.extensions.some((e) => e.name === "LTX25.Canvas"));
  try {
    Object.assign(result, await readCards(page));
  } catch (error) {
    result.cards_error = String(error?.stack ?? error);  // the template tests still run; the card test reports it
    await page.keyboard.press("Escape");
  }

  for (const [index, title] of templates.entries()) {
    const entry = (result.templates[title] = {});
    try {
      Object.assign(entry, await loadAndRun(page, title, index));
      const { run } = entry;
      if (run.status.status !== "success") throw new Error(`run ended: ${JSON.stringify(run.status).slice(0, 2000)}`);
      if (Object.keys(run.node_errors).length) {
        throw new Error(`the server refused nodes of the graph (their outputs never ran): ${
          JSON.stringify(run.node_errors).slice(0, 2000)}`);
      }
      await settle(page);
      entry.nodes = await measureNodes(page);
      entry.groups = await page.evaluate(() => window.comfyAPI.app.app.graph.groups.map((g) =>
        ({ title: g.title, box: [...(g._bounding ?? g.bounding)] })));
      await page.screenshot({ path: path.join(opt.out, `${title.replace(/\W+/g, "_")}_after.png`) });
      if (run.compare_ids.length) entry.viewer_covered = await viewerCovered(page);
      if (opt.thumbnails) await thumbnail(page, title);
      if (run.compare_ids.length) entry.viewer = await exerciseViewer(page, title);
    } catch (error) {
      entry.error = String(error?.stack ?? error);
    }
  }
} catch (error) {
  result.error = String(error?.stack ?? error);
} finally {
  await browser.close();
}
console.log(JSON.stringify(result));
