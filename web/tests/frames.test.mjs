// Frames: scrubber → index, ui payload → /view routes and a clear error on mismatched payloads.
import { test } from "node:test";
import assert from "node:assert/strict";
import { frameIndex, loadWithRetry, readAbPayload, viewRoute } from "../lib/frames.js";

test("scrubber value becomes an index clamped to the frames there are", () => {
  assert.equal(frameIndex("3", 9), 3, "range inputs give strings");
  assert.equal(frameIndex(2.6, 9), 3);
  assert.equal(frameIndex(12, 9), 8);
  assert.equal(frameIndex(-4, 9), 0);
  assert.equal(frameIndex("x", 9), 0);
  assert.equal(frameIndex(5, 0), 0, "no frames: index 0, never -1");
});

test("view route encodes the file reference and the per-run cache key", () => {
  const route = viewRoute({ filename: "ltx25 a_00001_.png", subfolder: "ab/x", type: "temp" }, "r1");
  const url = new URL(route, "http://h");
  assert.equal(url.pathname, "/view");
  assert.equal(url.searchParams.get("filename"), "ltx25 a_00001_.png");
  assert.equal(url.searchParams.get("subfolder"), "ab/x");
  assert.equal(url.searchParams.get("type"), "temp");
  assert.equal(url.searchParams.get("rand"), "r1");
  assert.equal(new URL(viewRoute({ filename: "f.png" }), "http://h").searchParams.get("type"), "temp");
});

test("payload with unequal frame counts is refused with both counts", () => {
  const ref = { filename: "f.png", subfolder: "", type: "temp" };
  assert.match(readAbPayload({ frames_a: [ref, ref], frames_b: [ref] }).error, /A has 2 frames, B has 1/);
  assert.match(readAbPayload(undefined).error, /ltx25_ab/);
  assert.match(readAbPayload({ frames_a: [], frames_b: [] }).error, /no frames/);
  const ok = readAbPayload({ frames_a: [ref], frames_b: [ref], label_a: "conv", label_b: "diff" }, 1);
  assert.deepEqual([ok.labelA, ok.labelB, ok.framesA.length], ["conv", "diff", 1]);
});

test("shown frames map to video frames: given indices, identity when all were written, else unknown", () => {
  const ref = { filename: "f.png" };
  const three = { frames_a: [ref, ref, ref], frames_b: [ref, ref, ref] };
  assert.deepEqual(readAbPayload({ ...three, frame_indices: [0, 40, 80] }, 81).sourceIndices, [0, 40, 80]);
  assert.deepEqual(readAbPayload(three, 3).sourceIndices, [0, 1, 2]);
  // 3 previews of an 81-frame video without indices: preview 2 is not frame 2, so no mapping at all.
  assert.equal(readAbPayload(three, 81).sourceIndices, null);
  assert.equal(readAbPayload({ ...three, frame_indices: [0, 40] }, 81).sourceIndices, null,
    "indices of the wrong length are ignored");
});

test("a preview frame not written yet is asked for again, each time under a new URL, then given up", () => {
  const pending = [];
  const image = {};
  loadWithRetry(image, (attempt) => `/view?f=a&rand=k.${attempt}`, 2, 250, (fn, ms) => pending.push([fn, ms]));
  assert.equal(image.src, "/view?f=a&rand=k.0");
  image.onerror();
  assert.deepEqual(pending.map(([, ms]) => ms), [250]);
  pending.shift()[0]();
  assert.equal(image.src, "/view?f=a&rand=k.1");
  image.onerror();
  pending.shift()[0]();
  assert.equal(image.src, "/view?f=a&rand=k.2");
  image.onerror();
  assert.equal(pending.length, 0, "after `retries` attempts the viewer stops asking");
});

test("the waits between attempts double up to a ceiling, so a frame written minutes late still shows", () => {
  const waits = [];
  const image = {};
  loadWithRetry(image, (attempt) => `/view?rand=k.${attempt}`, 7, 250, (fn, ms) => waits.push(ms) && fn(), 2000);
  for (let i = 0; i < 8; i++) image.onerror();
  assert.deepEqual(waits, [250, 500, 1000, 2000, 2000, 2000, 2000]);
  assert.equal(image.src, "/view?rand=k.7");
  const defaults = [];
  const byDefault = { onerror: null };
  loadWithRetry(byDefault, () => "/view", undefined, undefined, (fn, ms) => defaults.push(ms) && fn());
  for (let i = 0; i < 50; i++) byDefault.onerror();
  const total = defaults.reduce((sum, ms) => sum + ms, 0);
  assert.equal(defaults.length, 40);
  assert.ok(total > 120000, `the defaults wait ${total} ms in all`);
});

test("retries stop once the viewer has moved on to another run", () => {
  const pending = [];
  const image = {};
  let current = true;
  loadWithRetry(image, (attempt) => (attempt && !current ? null : `/view?rand=k.${attempt}`), 5, 250,
    (fn) => pending.push(fn));
  image.onerror();
  current = false;
  pending.shift()();
  assert.equal(image.src, "/view?rand=k.0", "a stale frame is not asked for again");
  assert.equal(pending.length, 0);
});
