// Wipe geometry for the A/B viewer: where the split is, and which part of each frame goes where on the canvas.
// Rectangles are {sx, sy, sw, sh, dx, dy, dw, dh}: the nine-argument drawImage's source and destination.

const clamp01 = (x) => Math.min(1, Math.max(0, x));

/** Pointer x (client pixels) over an element spanning [left, left + width] → split fraction in [0, 1]. */
export function splitFromPointer(clientX, left, width) {
  if (!(width > 0) || !Number.isFinite(clientX)) return 0.5;
  return clamp01((clientX - left) / width);
}

/** The largest rectangle of the image's aspect that fits the box, centred (letterboxed, never cropped). */
export function fitRect(imageW, imageH, boxW, boxH) {
  if (!(imageW > 0 && imageH > 0 && boxW > 0 && boxH > 0)) return { x: 0, y: 0, w: 0, h: 0 };
  const scale = Math.min(boxW / imageW, boxH / imageH);
  const w = imageW * scale, h = imageH * scale;
  return { x: (boxW - w) / 2, y: (boxH - h) / 2, w, h };
}

/**
 * A to the left of the split, B to the right, both mapped onto `fit` (from fitRect). The source column is cut
 * at the same fraction as the destination, so the two halves meet exactly at the divider. A side that is empty
 * (split 0 or 1) is null, because drawImage with a zero-width source throws in some browsers.
 */
export function wipeRects(imageW, imageH, fit, split) {
  const s = clamp01(split);
  const cutSrc = imageW * s, cutDst = fit.w * s;
  const a = cutSrc > 0
    ? { sx: 0, sy: 0, sw: cutSrc, sh: imageH, dx: fit.x, dy: fit.y, dw: cutDst, dh: fit.h }
    : null;
  const b = cutSrc < imageW
    ? { sx: cutSrc, sy: 0, sw: imageW - cutSrc, sh: imageH, dx: fit.x + cutDst, dy: fit.y, dw: fit.w - cutDst, dh: fit.h }
    : null;
  return { a, b };
}

/** The divider's x on the canvas, for drawing the line and placing the handle. */
export function dividerX(fit, split) {
  return fit.x + fit.w * clamp01(split);
}
