// Frames of the A/B viewer: the scrubber's value → a frame index, and the `ui` payload → /view queries.

/** Scrubber value (a number or the input's string) → frame index in [0, count - 1]; 0 when there are none. */
export function frameIndex(value, count) {
  const n = Math.floor(Number(count));
  if (!(n > 0)) return 0;
  const i = Math.round(Number(value));
  return Number.isFinite(i) ? Math.min(n - 1, Math.max(0, i)) : 0;
}

/** One image reference {filename, subfolder, type} → the route ComfyUI serves it from (before api.apiURL). */
export function viewRoute(ref, cacheKey = "") {
  const params = new URLSearchParams({
    filename: ref.filename,
    subfolder: ref.subfolder ?? "",
    type: ref.type ?? "temp",
  });
  // Temp file names repeat between runs; a per-run key keeps the browser from showing the last run's frames.
  if (cacheKey) params.set("rand", cacheKey);
  return `/view?${params}`;
}

/**
 * The compare node's `ui.ltx25_ab[0]` → {framesA, framesB, labelA, labelB, sourceIndices}, or {error} saying what
 * is wrong, so the viewer can show that instead of drawing mismatched frames.
 *
 * The node writes at most a few dozen preview frames of a longer video, so shown frame i is not video frame i.
 * `sourceIndices[i]` is the video frame (the index into the report's per-frame lists): from the payload's
 * `frame_indices` when present, the identity when every frame was written, otherwise null (figures unknown).
 */
export function readAbPayload(ab, reportFrames) {
  if (!ab || !Array.isArray(ab.frames_a) || !Array.isArray(ab.frames_b)) {
    return { error: "no frames in the node's output (ui.ltx25_ab)" };
  }
  const n = ab.frames_a.length;
  if (n !== ab.frames_b.length) return { error: `A has ${n} frames, B has ${ab.frames_b.length}` };
  if (n === 0) return { error: "no frames to show" };
  let sourceIndices = null;
  if (Array.isArray(ab.frame_indices) && ab.frame_indices.length === n) sourceIndices = ab.frame_indices;
  else if (n === reportFrames) sourceIndices = ab.frames_a.map((_, i) => i);
  return { framesA: ab.frames_a, framesB: ab.frames_b, labelA: ab.label_a ?? "A", labelB: ab.label_b ?? "B",
    sourceIndices };
}

/**
 * Point `image` at `urlFor(0)`, and after a failed load try `urlFor(1)`, `urlFor(2)`, … at most `retries` times,
 * waiting `delayMs` and then twice as long each time up to `maxDelayMs` (the defaults ask for ~2.5 minutes): the
 * compare node writes its preview frames in the background after it returns, beside the saves' encodes, so on a
 * busy machine a frame may reach the server well after the node's output. Each attempt has its own URL, so no
 * failure is served from cache. `urlFor` returning null stops the retries (the viewer has moved on to another run's
 * frames).
 */
export function loadWithRetry(image, urlFor, retries = 40, delayMs = 250, schedule = setTimeout, maxDelayMs = 4000) {
  let attempt = 0;
  image.onerror = () => {
    if (attempt >= retries) return;
    schedule(() => {
      const url = urlFor(++attempt);
      if (url !== null) image.src = url;
    }, Math.min(maxDelayMs, delayMs * 2 ** attempt));
  };
  image.src = urlFor(0);
  return image;
}
