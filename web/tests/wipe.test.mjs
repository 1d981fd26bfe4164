// Wipe geometry: the divider follows the pointer, and A and B tile the fitted image with no gap or overlap.
import { test } from "node:test";
import assert from "node:assert/strict";
import { dividerX, fitRect, splitFromPointer, wipeRects } from "../lib/wipe.js";

const near = (x, y, what) => assert.ok(Math.abs(x - y) < 1e-9, `${what}: ${x} vs ${y} (diff ${Math.abs(x - y)})`);

test("pointer x maps to the split fraction and is clamped to [0, 1]", () => {
  assert.equal(splitFromPointer(150, 100, 200), 0.25);
  assert.equal(splitFromPointer(50, 100, 200), 0, "left of the canvas pins the split at 0");
  assert.equal(splitFromPointer(400, 100, 200), 1, "right of the canvas pins the split at 1");
  assert.equal(splitFromPointer(150, 100, 0), 0.5, "a collapsed canvas must not divide by zero");
});

test("fit keeps the aspect, fills one axis and centres the other", () => {
  assert.deepEqual(fitRect(200, 100, 400, 400), { x: 0, y: 100, w: 400, h: 200 });
  assert.deepEqual(fitRect(100, 200, 400, 400), { x: 100, y: 0, w: 200, h: 400 });
  assert.deepEqual(fitRect(0, 100, 400, 400), { x: 0, y: 0, w: 0, h: 0 }, "an unloaded image draws nothing");
});

test("A and B meet at the divider and together cover the whole image", () => {
  const fit = fitRect(640, 360, 500, 400);
  for (const split of [0.1, 0.37, 0.5, 0.9]) {
    const { a, b } = wipeRects(640, 360, fit, split);
    near(a.dx + a.dw, b.dx, `destination seam at split ${split}`);
    near(a.sx + a.sw, b.sx, `source seam at split ${split}`);
    near(a.sw + b.sw, 640, "source widths add up to the image");
    near(a.dw + b.dw, fit.w, "destination widths add up to the fit");
    near(b.dx, dividerX(fit, split), "the handle sits on the seam");
    // Same scale on both sides, or one decoder would look stretched against the other.
    near(a.dw / a.sw, b.dw / b.sw, "horizontal scale of A vs B");
    assert.equal(a.sh, 360); assert.equal(b.dh, fit.h);
  }
});

test("at the ends one side is null instead of a zero-width draw", () => {
  const fit = fitRect(64, 64, 100, 100);
  assert.equal(wipeRects(64, 64, fit, 0).a, null);
  assert.equal(wipeRects(64, 64, fit, 0).b.sw, 64);
  assert.equal(wipeRects(64, 64, fit, 1).b, null);
  assert.equal(wipeRects(64, 64, fit, 1.7).b, null, "a split past 1 is clamped");
});
